// lm view: draws the page's embedded data (lm/explorer/gather.py) with canvas and SVG; no library,
// no request to any host (in serve mode, only to the page's own server for a new prompt).
"use strict";
const DATA = JSON.parse(document.getElementById("lm-data").textContent);
const state = { layer: 0, head: 0, query: [], version: 0, step: 0, headScore: "previous_token" };
const SVGNS = "http://www.w3.org/2000/svg";
const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2",
  "#17becf", "#7f7f7f", "#bcbd22"];
const tip = document.getElementById("tip");

function el(tag, attrs, ...kids) {
  const e = tag.startsWith("svg:") ? document.createElementNS(SVGNS, tag.slice(4))
    : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "text") e.textContent = v; else if (v !== null && v !== undefined) e.setAttribute(k, v);
  }
  for (const k of kids) if (k) e.append(k);
  return e;
}

// A weight w in [0, 1] as a colour: white to deep blue through sqrt(w), so that small weights
// still show (the legend says so). Pooled maps hold round(255 sqrt(w)) already.
function shade(t) {
  const stops = [[255, 255, 255], [107, 174, 214], [8, 48, 107]];
  const x = Math.max(0, Math.min(1, t)) * 2, i = Math.min(1, Math.floor(x)), f = x - i;
  return stops[i].map((c, j) => Math.round(c + (stops[i + 1][j] - c) * f));
}
const css = (rgb) => `rgb(${rgb.join(",")})`;
const MASKED = [236, 239, 242];

function showTip(ev, text) {
  tip.textContent = text; tip.style.display = "block";
  tip.style.left = (ev.clientX + 14) + "px"; tip.style.top = (ev.clientY + 12) + "px";
}
function hideTip() { tip.style.display = "none"; }
function tokenLabel(t) { return JSON.stringify(t); }

// A signed score s in [-m, m] as a colour: ColorBrewer's RdBu (colour-blind safe), blue below
// 0, white at 0, red above; t = s / m.
function diverge(t) {
  const stops = [[33, 102, 172], [103, 169, 207], [209, 229, 240], [247, 247, 247], [253, 219, 199],
    [239, 138, 98], [178, 24, 43]];
  const x = (Math.max(-1, Math.min(1, t)) + 1) * 3, i = Math.min(5, Math.floor(x)), f = x - i;
  return stops[i].map((c, j) => Math.round(c + (stops[i + 1][j] - c) * f));
}
// The largest |score| a head's unmasked cells hold (1 where all are 0).
function scoreScale(rows) {
  let m = 0;
  for (const row of rows) for (const s of row) if (s !== null) m = Math.max(m, Math.abs(s));
  return m || 1;
}
// Colour of cell (q, k) of a lower-triangular map, or MASKED: weights through √, scores diverging.
function weightAt(rows) { return (q, k) => (k <= q ? shade(Math.sqrt(rows[q][k])) : MASKED); }
function scoreAt(rows) {
  const m = scoreScale(rows);
  return (q, k) => (k <= q && rows[q][k] !== null ? diverge(rows[q][k] / m) : MASKED);
}
function pooledAt(b64, n) {
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  return (q, k) => (k <= q ? shade(bytes[q * n + k] / 255) : MASKED);
}

// An n x n map on a canvas, one pixel per cell, coloured by colourAt(q, k).
function drawCells(canvas, n, colourAt) {
  canvas.width = n; canvas.height = n;
  const ctx = canvas.getContext("2d"), img = ctx.createImageData(n, n);
  for (let q = 0; q < n; q++) for (let k = 0; k < n; k++) {
    const rgb = colourAt(q, k), o = 4 * (q * n + k);
    img.data[o] = rgb[0]; img.data[o + 1] = rgb[1]; img.data[o + 2] = rgb[2]; img.data[o + 3] = 255;
  }
  ctx.putImageData(img, 0, 0);
}
function drawMap(canvas, rows) { drawCells(canvas, rows.length, weightAt(rows)); }


// Figures as files, offline: every figure is an SVG the page builds from its data (a canvas map
// becomes one rect per cell); its PNG is that SVG drawn on a canvas at twice the size.
const SVG_CSS = "text { font: 11px sans-serif; fill: #57606a; } .title { font-size: 13px; fill: #24292f; }" +
  " .axis { stroke: #8c959f; } .gridline { stroke: #eaeef2; } path.series { fill: none; stroke-width: 1.6; }" +
  " path.series.on { stroke-width: 3; } .cursor { display: none; }";

// A standalone SVG document of `body` (an svg with a viewBox) under a title, on white; `keys`,
// [label, colour] pairs, the lines' or bars' legend below it.
function svgFile(body, title, keys = []) {
  const [, , W, H] = body.getAttribute("viewBox").split(" ").map(Number), top = 24, low = keys.length * 16;
  const root = el("svg:svg", { xmlns: SVGNS, width: W, height: H + top + low, viewBox: `0 0 ${W} ${H + top + low}` },
    el("svg:style", { text: SVG_CSS }), el("svg:rect", { width: W, height: H + top + low, fill: "#fff" }),
    el("svg:text", { class: "title", x: 4, y: 16, text: title }));
  const inner = el("svg:g", { transform: `translate(0 ${top})` });
  for (const kid of body.childNodes) inner.append(kid.cloneNode(true));
  root.append(inner);
  keys.forEach(([label, colour], i) => {
    const y = H + top + i * 16 + 8;
    root.append(el("svg:rect", { x: 8, y: y - 4, width: 14, height: 4, fill: colour }), el("svg:text", { x: 28, y: y + 2, text: label }));
  });
  return root;
}

// A lower-triangular map as SVG: a grey square (masked), a rect per cell on and below the
// diagonal; the legend (legendSvg) below it.
function mapSvg(n, colourAt, legend) {
  const c = Math.max(2, Math.floor(384 / n)), size = n * c, lh = 46;
  const svg = el("svg:svg", { viewBox: `0 0 ${Math.max(size, 320)} ${size + lh}` },
    el("svg:rect", { class: "masked", width: size, height: size, fill: css(MASKED) }));
  for (let q = 0; q < n; q++) for (let k = 0; k <= q; k++) {
    svg.append(el("svg:rect", { class: "cell", x: k * c, y: q * c, width: c, height: c, fill: css(colourAt(q, k)) }));
  }
  const g = el("svg:g", { transform: `translate(0 ${size + 4})` });
  for (const kid of legend.childNodes) g.append(kid.cloneNode(true));
  svg.append(g);
  return svg;
}

// A colour bar: colour(t) for t from 0 to 1, three labels under it (left, middle, right).
function legendSvg(colour, labels, caption) {
  const W = 320, svg = el("svg:svg", { viewBox: `0 0 ${W} 40`, class: "legendbar", style: `width: ${W}px` });
  for (let i = 0; i < 52; i++) svg.append(el("svg:rect", { x: 4 + i * 4, y: 2, width: 4.5, height: 10, fill: css(colour(i / 51)) }));
  labels.forEach((t, i) => svg.append(el("svg:text", { x: 4 + i * 104, y: 24, "text-anchor": ["start", "middle", "end"][i], text: t })));
  svg.append(el("svg:text", { x: 4, y: 36, text: caption }));
  return svg;
}
const WEIGHT_LEGEND = () => legendSvg((t) => shade(Math.sqrt(t)), ["0", "0.25", "1"], "attention weight (colour: √weight); grey: masked");
const scoreLegend = (m) => legendSvg((t) => diverge(2 * t - 1), [String(-m.toPrecision(3)), "0", String(+m.toPrecision(3))],
  "score, blue below 0, red above; grey: masked");

function save(name, blob) {
  const a = el("a", { href: URL.createObjectURL(blob), download: name });
  document.body.append(a); a.click(); a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
}
function svgText(svg) { return '<?xml version="1.0" encoding="UTF-8"?>\n' + new XMLSerializer().serializeToString(svg); }
function savePng(name, svg) {
  const img = new Image(), W = +svg.getAttribute("width"), H = +svg.getAttribute("height");
  img.onload = () => {
    const c = el("canvas", { width: 2 * W, height: 2 * H }), ctx = c.getContext("2d");
    ctx.scale(2, 2); ctx.drawImage(img, 0, 0, W, H);
    c.toBlob((blob) => save(name + ".png", blob), "image/png");
  };
  img.src = "data:image/svg+xml;charset=utf-8," + encodeURIComponent(svgText(svg));
}
// SVG and PNG buttons for a figure: make() gives its standalone SVG (svgFile), built on click.
function downloads(name, make) {
  const file = name.replace(/[^A-Za-z0-9]+/g, "-").replace(/^-|-$/g, "").slice(0, 80) || "figure";
  const svgButton = el("button", { class: "dl", "data-kind": "svg", text: "SVG" });
  const pngButton = el("button", { class: "dl", "data-kind": "png", text: "PNG" });
  svgButton.addEventListener("click", () => save(file + ".svg", new Blob([svgText(make())], { type: "image/svg+xml" })));
  pngButton.addEventListener("click", () => savePng(file, make()));
  return el("span", { class: "downloads" }, svgButton, pngButton);
}
function figureTitle(text, name, make) { return el("div", { class: "fighead" }, el("h3", { text }), downloads(name, make)); }

function ticks(lo, hi, count) {
  if (hi === lo) { hi = lo + 1; }
  const step0 = (hi - lo) / count, mag = Math.pow(10, Math.floor(Math.log10(step0)));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= step0);
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + 1e-9; v += step) out.push(+v.toFixed(10));
  return out;
}

// A line chart of series {label, x, y}; the svg carries its axes' domains and pixel ranges
// (data-x0 ... data-py1) so that a reader, or a test, can turn a path's points back to values.
function lineChart(chart, opts) {
  const W = opts.width || 460, H = opts.height || 240, L = 58, R = 12, Tp = 10, B = 38;
  const shown = chart.series.filter((s) => !opts.visible || opts.visible(s));
  const xs = shown.flatMap((s) => s.x || chart.x), ys = shown.flatMap((s) => s.y);
  let x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) { y0 -= 0.5; y1 += 0.5; }
  const pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad;
  const px = (x) => L + (x - x0) / (x1 - x0) * (W - L - R), py = (y) => H - B - (y - y0) / (y1 - y0) * (H - B - Tp);
  const svg = el("svg:svg", { viewBox: `0 0 ${W} ${H}`, style: `width: 100%; max-width: ${W}px`, class: "linechart", "data-x0": x0, "data-x1": x1,
    "data-px0": L, "data-px1": W - R, "data-y0": y0, "data-y1": y1, "data-py0": H - B, "data-py1": Tp });
  for (const t of ticks(y0, y1, 5)) {
    svg.append(el("svg:line", { x1: L, x2: W - R, y1: py(t), y2: py(t), class: "gridline" }));
    svg.append(el("svg:text", { x: L - 4, y: py(t) + 4, "text-anchor": "end", text: +t.toPrecision(4) }));
  }
  for (const t of ticks(x0, x1, 6)) {
    svg.append(el("svg:text", { x: px(t), y: H - B + 14, "text-anchor": "middle", text: t }));
  }
  svg.append(el("svg:line", { x1: L, x2: W - R, y1: H - B, y2: H - B, class: "axis" }));
  svg.append(el("svg:line", { x1: L, x2: L, y1: Tp, y2: H - B, class: "axis" }));
  svg.append(el("svg:text", { x: (L + W - R) / 2, y: H - 6, "text-anchor": "middle", text: opts.xlabel || chart.xlabel || "" }));
  svg.append(el("svg:text", { x: 12, y: (Tp + H - B) / 2, "text-anchor": "middle",
    transform: `rotate(-90 12 ${(Tp + H - B) / 2})`, text: chart.ylabel || "" }));
  shown.forEach((s, i) => {
    const x = s.x || chart.x;
    const d = s.y.map((v, j) => `${j ? "L" : "M"}${px(x[j]).toFixed(2)},${py(v).toFixed(2)}`).join("");
    svg.append(el("svg:path", { d, class: "series" + (opts.on && opts.on(s) ? " on" : ""),
      stroke: COLORS[i % COLORS.length], "data-label": s.label, "data-layer": s.layer, "data-head": s.head }));
    if (s.y.length <= 30) s.y.forEach((v, j) => svg.append(el("svg:circle", { cx: px(x[j]), cy: py(v), r: 2.5, fill: COLORS[i % COLORS.length] })));
  });
  const cursor = el("svg:line", { y1: Tp, y2: H - B, class: "cursor", visibility: "hidden" });
  svg.append(cursor);
  svg.addEventListener("mousemove", (ev) => {
    const box = svg.getBoundingClientRect(), u = (ev.clientX - box.left) * W / box.width;
    const at = x0 + (u - L) / (W - L - R) * (x1 - x0);
    const lines = shown.map((s) => {
      const x = s.x || chart.x;
      let j = 0; x.forEach((v, i) => { if (Math.abs(v - at) < Math.abs(x[j] - at)) j = i; });
      return `${s.label}: ${(opts.xlabel || chart.xlabel || "x")} ${x[j]} → ${(+s.y[j]).toFixed(4)}`;
    });
    cursor.setAttribute("x1", u); cursor.setAttribute("x2", u);
    cursor.setAttribute("visibility", "visible");
    showTip(ev, lines.slice(0, 12).join("\n"));
  });
  svg.addEventListener("mouseleave", () => { cursor.setAttribute("visibility", "hidden"); hideTip(); });
  const legend = el("div", { class: "legend" });
  if (shown.length > 1) shown.forEach((s, i) => legend.append(el("span", {}, el("i", { style: `background:${COLORS[i % COLORS.length]}` }), s.label)));
  const keys = shown.length > 1 ? shown.map((s, i) => [s.label, COLORS[i % COLORS.length]]) : [];
  const file = () => svgFile(svg, chart.title, keys);
  return el("div", { class: "chart " + (opts.kind || "") }, figureTitle(chart.title, chart.title, file), svg, legend);
}

// Grouped bars: groups (x labels) of one bar per series.
function barChart(title, labels, series, ylabel) {
  const W = 460, H = 200, L = 50, B = 34, Tp = 8, R = 14;
  const top = Math.max(1e-9, ...series.flatMap((s) => s.y));
  const svg = el("svg:svg", { viewBox: `0 0 ${W} ${H}`, style: `width: 100%; max-width: ${W}px`, class: "barchart" });
  for (const t of ticks(0, top, 4)) {
    const y = H - B - t / top * (H - B - Tp);
    svg.append(el("svg:line", { x1: L, x2: W, y1: y, y2: y, class: "gridline" }));
    svg.append(el("svg:text", { x: L - 4, y: y + 4, "text-anchor": "end", text: +t.toPrecision(3) }));
  }
  const gw = (W - L - R) / labels.length, bw = gw * 0.8 / series.length;
  labels.forEach((lab, g) => {
    series.forEach((s, i) => {
      const h = s.y[g] / top * (H - B - Tp), x = L + g * gw + gw * 0.1 + i * bw;
      const bar = el("svg:rect", { x, y: H - B - h, width: bw - 1, height: h, fill: COLORS[i % COLORS.length] });
      bar.addEventListener("mousemove", (ev) => showTip(ev, `${s.label}, ${lab}: ${(+s.y[g]).toFixed(4)}`));
      bar.addEventListener("mouseleave", hideTip);
      svg.append(bar);
    });
    svg.append(el("svg:text", { x: L + g * gw + gw / 2, y: H - B + 14, "text-anchor": "middle", text: lab,
      style: labels.length > 8 ? "font-size: 9px" : null }));
  });
  svg.append(el("svg:line", { x1: L, x2: W, y1: H - B, y2: H - B, class: "axis" }));
  svg.append(el("svg:text", { x: 10, y: (H - B) / 2, "text-anchor": "middle", transform: `rotate(-90 10 ${(H - B) / 2})`, text: ylabel }));
  const legend = el("div", { class: "legend" });
  series.forEach((s, i) => legend.append(el("span", {}, el("i", { style: `background:${COLORS[i % COLORS.length]}` }), s.label)));
  const file = () => svgFile(svg, title, series.map((s, i) => [s.label, COLORS[i % COLORS.length]]));
  return el("div", { class: "chart" }, figureTitle(title, title, file), svg, legend);
}

function tokenSpan(t, i) {
  const shown = t.replace(/ /g, "·").replace(/\n/g, "↵").replace(/\t/g, "→");
  return el("span", { class: "tok" + (/^\s+$/.test(t) ? " ws" : ""), "data-i": i, text: shown });
}

// Query q of run r: its keys' weights in the strip (data-w, 4 decimals) and the top keys.
function showQuery(r, q) {
  const run = DATA.runs[r], sec = document.querySelector(`.run[data-run="${r}"]`);
  q = Math.min(q, run.tokens.length - 1); state.query[r] = q;
  const [L, H] = at(run), row = run.weights[L][H][q];
  sec.querySelectorAll(".tokens .tok").forEach((span, j) => {
    span.classList.toggle("query", j === q); span.classList.toggle("masked", j > q);
    if (j <= q) {
      span.dataset.w = row[j].toFixed(4); span.style.background = css(shade(Math.sqrt(row[j])));
      span.style.color = row[j] > 0.3 ? "#fff" : ""; span.title = `key ${j} ${tokenLabel(run.tokens[j])}: ${row[j].toFixed(4)}`;
    } else {
      delete span.dataset.w; span.style.background = ""; span.style.color = ""; span.title = "";
    }
  });
  const best = row.map((w, j) => [w, j]).sort((a, b) => b[0] - a[0]).slice(0, 6);
  sec.querySelector(".reads").textContent = `layer ${L} head ${H}, query ${q} ${tokenLabel(run.tokens[q])} reads: ` +
    best.map(([w, j]) => `${tokenLabel(run.tokens[j])}@${j} ${w.toFixed(4)}`).join(", ");
}

// The chosen layer and head, within what this run has (compared runs may differ in shape).
function at(run) { return [Math.min(state.layer, run.n_layer - 1), Math.min(state.head, run.n_head - 1)]; }

function attentionPanel(run, r) {
  const [L, H] = at(run);
  const big = el("canvas", { class: "big", "data-layer": L, "data-head": H });
  drawMap(big, run.weights[L][H]);
  big.addEventListener("mousemove", (ev) => {
    const box = big.getBoundingClientRect(), T = run.tokens.length;
    const q = Math.floor((ev.clientY - box.top) / box.height * T), k = Math.floor((ev.clientX - box.left) / box.width * T);
    if (q < 0 || q >= T || k < 0 || k >= T) return;
    const w = k <= q ? run.weights[L][H][q][k].toFixed(4) : "masked (key after query)";
    showTip(ev, `query ${q} ${tokenLabel(run.tokens[q])}\nkey ${k} ${tokenLabel(run.tokens[k])}\nweight ${w}`);
    showQuery(r, q);
  });
  big.addEventListener("mouseleave", hideTip);
  const strip = el("div", { class: "tokens" }, ...run.tokens.map(tokenSpan));
  strip.addEventListener("mouseover", (ev) => {
    const i = ev.target.dataset && ev.target.dataset.i;
    if (i !== undefined) for (let s = 0; s < DATA.runs.length; s++) showQuery(s, +i);
  });
  const grid = el("div", { class: "grid", style: `grid-template-columns: repeat(${run.n_head}, auto)` });
  for (let l = 0; l < run.n_layer; l++) for (let h = 0; h < run.n_head; h++) {
    const c = el("canvas", { class: "heatmap", "data-layer": l, "data-head": h });
    drawMap(c, run.weights[l][h]);
    const cell = el("div", { class: "cell" + (l === L && h === H ? " on" : "") }, c, `L${l} H${h}`);
    cell.addEventListener("click", () => { state.layer = l; state.head = h; render(); });
    grid.append(cell);
  }
  const title = `Attention A = ${run.normalize === "softmax" ? "softmax_row(S + M)" : run.normalize + "(S + M)"}: layer ${L}, head ${H}, step ${run.step}`;
  const file = () => svgFile(mapSvg(run.tokens.length, weightAt(run.weights[L][H]), WEIGHT_LEGEND()), title);
  return el("div", { class: "panel" }, figureTitle(title, `attention-L${L}-H${H}-step${run.step}`, file),
    el("p", { class: "why", text: "Rows are queries, columns keys; grey cells are masked (a key after its query). Hover a token or a cell: the keys that query reads, weights to 4 decimals. Colour: √weight, white 0 to blue 1." }),
    strip, el("div", { class: "reads" }), big, WEIGHT_LEGEND(),
    el("h3", { text: "Every layer (rows) and head (columns); click one" }), grid);
}

// The signed scores before normalization, S + M (S + B + M with a scheme's bias), diverging
// about 0 on this head's own scale; masked cells grey, never a colour for -inf.
function scorePanel(run) {
  const [L, H] = at(run), rows = run.scores[L][H], m = scoreScale(rows), T = rows.length;
  const sum = run.bias ? "S + B + M" : "S + M";
  const big = el("canvas", { class: "big scores", "data-layer": L, "data-head": H });
  drawCells(big, T, scoreAt(rows));
  big.addEventListener("mousemove", (ev) => {
    const box = big.getBoundingClientRect();
    const q = Math.floor((ev.clientY - box.top) / box.height * T), k = Math.floor((ev.clientX - box.left) / box.width * T);
    if (q < 0 || q >= T || k < 0 || k >= T) return;
    const s = k <= q && rows[q][k] !== null ? rows[q][k].toFixed(3) : "masked";
    showTip(ev, `query ${q} ${tokenLabel(run.tokens[q])}\nkey ${k} ${tokenLabel(run.tokens[k])}\nscore ${s}`);
  });
  big.addEventListener("mouseleave", hideTip);
  const title = `Scores ${sum} before ${run.normalize}: layer ${L}, head ${H}, step ${run.step}`;
  const file = () => svgFile(mapSvg(T, scoreAt(rows), scoreLegend(m)), title);
  return el("div", { class: "panel" }, figureTitle(title, `scores-L${L}-H${H}-step${run.step}`, file),
    el("p", { class: "why", text: `The signed scores the ${run.normalize} reads (S = q·k/√d_k${run.bias ? ", B the scheme's bias" : ""}, M the mask), to 3 decimals; colour scaled to this head's largest |score|, ${m.toFixed(2)}.` }),
    big, scoreLegend(m));
}

const HEAD_SCORES = ["previous_token", "induction", "duplicate_token", "first_token"];
const HEAD_WHY = {
  previous_token: "mean weight on the key just before the query",
  induction: "mean weight on the token after the earlier copy of the query's token",
  duplicate_token: "mean weight on the earlier copy of the query's token",
  first_token: "mean weight on the first token",
};

// Layers (rows) by heads (columns), each cell a head's score on the repeated probe.
function headGridSvg(run, name) {
  const grid = run.heads[name], c = 44, left = 30, top = 16, [L, H] = at(run);
  const svg = el("svg:svg", { viewBox: `0 0 ${left + run.n_head * c + 2} ${top + run.n_layer * c + 2}`, class: "headgrid",
    style: `width: ${left + run.n_head * c + 2}px` });
  for (let h = 0; h < run.n_head; h++) svg.append(el("svg:text", { x: left + h * c + c / 2, y: 11, "text-anchor": "middle", text: `H${h}` }));
  grid.forEach((row, l) => {
    svg.append(el("svg:text", { x: left - 4, y: top + l * c + c / 2 + 4, "text-anchor": "end", text: `L${l}` }));
    row.forEach((v, h) => {
      const on = l === L && h === H;
      svg.append(el("svg:rect", { class: "hcell", x: left + h * c, y: top + l * c, width: c - 2, height: c - 2, fill: css(shade(v)),
        stroke: on ? "#d1242f" : "#d0d7de", "stroke-width": on ? 3 : 1, "data-layer": l, "data-head": h, "data-value": v }));
      svg.append(el("svg:text", { x: left + h * c + c / 2 - 1, y: top + l * c + c / 2 + 3, "text-anchor": "middle",
        style: `fill: ${v > 0.55 ? "#fff" : "#24292f"}; pointer-events: none`, text: v.toFixed(2) }));
    });
  });
  return svg;
}

function headPanel(run) {
  if (!run.heads) return null;
  const name = state.headScore, svg = headGridSvg(run, name);
  const pick = el("select", { id: "headscore" }, ...HEAD_SCORES.map((n) => el("option", { value: n, text: n.replace("_", " "), selected: n === name ? "" : null })));
  pick.addEventListener("change", () => { state.headScore = pick.value; render(); });
  svg.addEventListener("click", (ev) => {
    const cell = ev.target.closest(".hcell");
    if (!cell) return;
    state.layer = +cell.dataset.layer; state.head = +cell.dataset.head; render();
    document.querySelector(".run canvas.big").scrollIntoView({ block: "center" });
  });
  const title = `Head scores, ${name.replace("_", " ")}: step ${run.step}`;
  const legend = legendSvg((t) => shade(t), ["0", "0.5", "1"], "score (mean attention weight)");
  const file = () => svgFile(headGridSvg(run, name), `${title} (${HEAD_WHY[name]})`);
  return el("div", { class: "panel" }, figureTitle(title, `heads-${name}-step${run.step}`, file), pick,
    el("p", { class: "why", text: `Each head's ${HEAD_WHY[name]}, on random tokens written twice; click a head for its maps.` }), svg, legend);
}

// A passkey run's accuracy by length (rows) and depth (columns), as lm eval wrote it.
function passkeySvg(grid) {
  const depths = grid.rows[0].depths.map((d) => d.depth), c = 46, left = 56, top = 28;
  const svg = el("svg:svg", { viewBox: `0 0 ${left + depths.length * c + 4} ${top + grid.rows.length * 26 + 4}`, class: "passkey",
    style: `width: ${left + depths.length * c + 4}px` });
  svg.append(el("svg:text", { x: left, y: 10, text: "depth of the key" }));
  depths.forEach((d, j) => svg.append(el("svg:text", { x: left + j * c + c / 2, y: top - 4, "text-anchor": "middle", text: `${Math.round(100 * d)}%` })));
  grid.rows.forEach((r, i) => {
    const y = top + i * 26;
    svg.append(el("svg:text", { x: left - 4, y: y + 16, "text-anchor": "end", text: `${r.length}${r.trained ? " (1x)" : ""}` }));
    r.depths.forEach((d, j) => {
      const a = d.accuracy;
      svg.append(el("svg:rect", { class: "pcell", x: left + j * c, y, width: c - 2, height: 24, fill: css(a === null ? MASKED : shade(a)) }));
      svg.append(el("svg:text", { x: left + j * c + c / 2 - 1, y: y + 16, "text-anchor": "middle",
        style: `fill: ${a !== null && a > 0.55 ? "#fff" : "#24292f"}`, text: a === null ? "n/a" : `${Math.round(100 * a)}%` }));
    });
  });
  return svg;
}

function passkeyPanel(run) {
  const grid = run.passkey;
  if (!grid) return null;
  if (grid.note) return el("div", { class: "panel" }, el("h3", { text: "Passkey retrieval" }), el("p", { class: "note", text: grid.note }));
  const title = `Passkey accuracy by length and depth, k_max ${grid.k_max ?? "none"} (lm eval, step ${grid.step})`;
  return el("div", { class: "panel" }, figureTitle(title, `passkey-step${grid.step}`, () => svgFile(passkeySvg(grid), title)),
    el("p", { class: "why", text: `Rows: lengths in tokens (1x: the trained context); columns: where the key stands. k_max: the longest length at which it and every shorter one retrieve at least ${Math.round(100 * grid.success)}% of the keys, over all depths (Position Interpolation's).` }),
    passkeySvg(grid), legendSvg((t) => shade(t), ["0%", "50%", "100%"], "keys retrieved; grey: out of the model's reach"));
}

function signalPanel(run) {
  const [L, H] = at(run);
  const panel = el("div", { class: "panel" }, el("h3", { text: "The position signal against distance n = l − j" }));
  if (run.undrawn) panel.append(el("p", { class: "note", text: run.undrawn }));
  for (const chart of run.signals) {
    const perLayer = chart.series.some((s) => s.layer !== null);
    panel.append(lineChart(chart, { xlabel: "distance n", kind: "signal",
      visible: (s) => !perLayer || s.layer === L || !chart.series.some((t) => t.layer === L),
      on: (s) => s.head === H }));
  }
  return panel;
}

function longPanel(run) {
  const [L, H] = at(run);
  const panel = el("div", { class: "panel" }, el("h3", { text: "The trained length beside a longer one" }));
  const lv = run.long;
  if (lv.note) { panel.append(el("p", { class: "note", text: lv.note })); return panel; }
  const names = Object.keys(lv.views);
  panel.append(el("p", { class: "why", text: `The prompt continued greedily to ${lv.factor}× the trained context (${run.context} tokens), layer ${L}, head ${H}, at step ${run.final ?? run.step}; long maps pooled into blocks for drawing.` }));
  const pair = el("div", { class: "pair" });
  for (const name of names) {
    const v = lv.views[name], c = el("canvas", { class: "longmap", "data-view": name });
    drawCells(c, v.cells, pooledAt(v.pictures[L][H], v.cells));
    c.addEventListener("mousemove", (ev) => {
      const box = c.getBoundingClientRect(), q = Math.floor((ev.clientY - box.top) / box.height * v.cells);
      const k = Math.floor((ev.clientX - box.left) / box.width * v.cells);
      showTip(ev, `queries ${q * v.block}–${Math.min(v.tokens, (q + 1) * v.block) - 1}, keys ${k * v.block}–${Math.min(v.tokens, (k + 1) * v.block) - 1}`);
    });
    c.addEventListener("mouseleave", hideTip);
    const caption = `${name}: ${v.tokens} tokens, entropy ${v.entropy[L][H].toFixed(3)} nats`;
    const file = () => svgFile(mapSvg(v.cells, pooledAt(v.pictures[L][H], v.cells), WEIGHT_LEGEND()),
      `layer ${L}, head ${H}, ${caption}` + (v.block > 1 ? `, blocks of ${v.block} tokens` : ""));
    pair.append(el("figure", {}, c, el("figcaption", { text: caption + " " }, downloads(`attention-${name}-L${L}-H${H}`, file))));
  }
  panel.append(pair);
  const heads = [...Array(run.n_head).keys()];
  panel.append(barChart(`Attention entropy per head, layer ${L} (nats, mean over queries)`, heads.map((h) => `H${h}`),
    names.map((n) => ({ label: n, y: lv.views[n].entropy[L] })), "entropy"));
  const e = lv.edges, buckets = e.slice(0, -1).map((a, i) => (e[i + 1] - a > 1 ? `${a}–${e[i + 1] - 1}` : `${a}`));
  panel.append(barChart(`Attended distance, layer ${L} head ${H} (weight per bucket, mean over queries)`, buckets,
    names.map((n) => ({ label: n, y: lv.views[n].histogram[L][H] })), "weight"));
  return panel;
}

function taskPanel(run) {
  if (!run.task) return null;
  const flip = run.task.some((t) => "distance" in t);
  const right = run.task.filter((t) => t.correct).length;
  const table = el("table", { class: "task" }, el("tr", {}, ...["split", "length", "prompt", "answer", "said", "", ...(flip ? ["distance since the last write"] : [])].map((h) => el("th", { text: h }))));
  for (const t of run.task) {
    const tr = el("tr", {}, el("td", { text: t.split || "" }), el("td", { text: t.length }), el("td", { class: "p", text: t.prompt }),
      el("td", { class: "p", text: t.answer }), el("td", { class: "p", text: t.said }),
      el("td", { class: t.correct ? "ok" : "no", text: t.correct ? "✓" : "✗" }), flip ? el("td", { text: t.distance }) : null);
    if (DATA.serve) tr.addEventListener("click", () => { document.getElementById("text").value = t.prompt; recompute(); });
    table.append(tr);
  }
  return el("div", { class: "panel" }, el("h3", { text: `Evaluated examples: ${right} of ${run.task.length} right` }), table);
}

function render() {
  document.getElementById("layer").value = state.layer; document.getElementById("head").value = state.head;
  const scrub = document.getElementById("step");
  if (scrub) { scrub.value = state.step; document.getElementById("steplabel").textContent = `step ${DATA.runs[0].step}`; }
  const main = document.getElementById("runs"); main.replaceChildren();
  DATA.runs.forEach((run, r) => {
    const sec = el("section", { class: "run", "data-run": r },
      el("h2", { text: run.name }),
      el("p", { class: "meta", text: `${run.scheme} positions, ${run.normalize}, ${run.n_layer} layers × ${run.n_head} heads, trained context ${run.context}, step ${run.step}` }),
      el("div", { class: "panels" }, attentionPanel(run, r), scorePanel(run), headPanel(run), signalPanel(run),
        DATA.kind === "run" ? longPanel(run) : null, passkeyPanel(run), taskPanel(run)));
    main.append(sec);
    showQuery(r, state.query[r] === undefined ? run.tokens.length - 1 : state.query[r]);
  });
  const curves = document.getElementById("curves"); curves.replaceChildren();
  for (const chart of DATA.curves) curves.append(lineChart(chart, { width: 520, height: 280, kind: "curve" }));
  document.body.dataset.version = state.version;
}

// The checkpoint scrubber: a run's maps, scores, head grid and signal at each checkpoint the page
// holds (its newest one's are the run's own fields; the 4x view stays at the newest).
function scrubber(run) {
  const shown = [...run.checkpoints, Object.fromEntries(["step", "weights", "scores", "heads", "signals"].map((k) => [k, run[k]]))];
  run.final = run.step; state.step = shown.length - 1;
  const slider = el("input", { id: "step", type: "range", min: 0, max: shown.length - 1, step: 1, value: state.step,
    title: `steps ${shown.map((c) => c.step).join(", ")}` });
  slider.addEventListener("input", () => { state.step = +slider.value; Object.assign(run, shown[state.step]); render(); });
  return [el("label", { for: "step", text: `Checkpoint (${shown.length})` }), slider, el("span", { id: "steplabel" })];
}

function setup() {
  const first = DATA.runs[0], controls = document.getElementById("controls");
  const layers = Math.max(...DATA.runs.map((r) => r.n_layer)), heads = Math.max(...DATA.runs.map((r) => r.n_head));
  const pick = (id, n, name) => {
    const s = el("select", { id }, ...[...Array(n).keys()].map((i) => el("option", { value: i, text: `${name} ${i}` })));
    s.addEventListener("change", () => { state[id] = +s.value; render(); });
    return s;
  };
  controls.append(el("label", { text: "Show" }), pick("layer", layers, "layer"), pick("head", heads, "head"));
  if (DATA.kind === "run" && first.checkpoints && first.checkpoints.length) controls.append(...scrubber(first));
  if (DATA.serve) {
    const box = el("textarea", { id: "text", spellcheck: "false" });
    box.value = first.prompt;
    let timer = null;
    box.addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(recompute, 250); });
    controls.append(el("label", { for: "text", text: "Text" }), box, el("span", { id: "status" }));
  }
  document.addEventListener("keydown", (ev) => {
    if (ev.target.tagName === "TEXTAREA") return;
    const step = { ArrowLeft: -1, ArrowRight: 1 }[ev.key];
    if (step) for (let r = 0; r < DATA.runs.length; r++) showQuery(r, Math.max(0, (state.query[r] || 0) + step));
  });
  render();
}

// The text goes as the body of a POST (no limit on an address's length); whatever comes back,
// an error of the server's (one line), an answer that is not JSON, or none, the status says it.
async function recompute() {
  const status = document.getElementById("status"), text = document.getElementById("text").value;
  status.className = ""; status.textContent = "computing…";
  let answer;
  try {
    const r = await fetch("data", { method: "POST", body: text, headers: { "Content-Type": "text/plain; charset=utf-8" } });
    const body = await r.text();
    try { answer = JSON.parse(body) ?? {}; } catch { answer = {}; }
    if (!r.ok && !answer.error) answer = { error: `${r.status} ${r.statusText}: ${body.trim().split("\n")[0]}` };
  } catch (e) {
    answer = { error: `no answer from lm view's server (${e.message})` };
  }
  if (document.getElementById("text").value !== text) return;  // typed on since: a newer one comes
  if (answer.error || !answer.runs) { status.className = "bad"; status.textContent = answer.error || "not an answer lm view gives"; return; }
  DATA.runs = answer.runs; state.query = []; state.version += 1;
  status.textContent = `${answer.runs[0].tokens.length} tokens`;
  render();
}

setup();
