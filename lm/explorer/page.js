// lm view: draws the page's embedded data (lm/explorer/gather.py) with canvas and SVG; no library,
// no request to any host (in serve mode, only to the page's own server for a new prompt).
"use strict";
const DATA = JSON.parse(document.getElementById("lm-data").textContent);
const state = { layer: 0, head: 0, query: [], version: 0 };
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

// A lower-triangular map (rows[q] holds keys 0..q) on a T x T canvas, one pixel per cell.
function drawMap(canvas, rows) {
  const T = rows.length; canvas.width = T; canvas.height = T;
  const ctx = canvas.getContext("2d"), img = ctx.createImageData(T, T);
  for (let q = 0; q < T; q++) for (let k = 0; k < T; k++) {
    const rgb = k <= q ? shade(Math.sqrt(rows[q][k])) : MASKED, o = 4 * (q * T + k);
    img.data[o] = rgb[0]; img.data[o + 1] = rgb[1]; img.data[o + 2] = rgb[2]; img.data[o + 3] = 255;
  }
  ctx.putImageData(img, 0, 0);
}

// A pooled map: n x n bytes (base64) of round(255 sqrt(w)).
function drawPooled(canvas, b64, n) {
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  canvas.width = n; canvas.height = n;
  const ctx = canvas.getContext("2d"), img = ctx.createImageData(n, n);
  for (let q = 0; q < n; q++) for (let k = 0; k < n; k++) {
    const rgb = k <= q ? shade(bytes[q * n + k] / 255) : MASKED, o = 4 * (q * n + k);
    img.data[o] = rgb[0]; img.data[o + 1] = rgb[1]; img.data[o + 2] = rgb[2]; img.data[o + 3] = 255;
  }
  ctx.putImageData(img, 0, 0);
}

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
  return el("div", { class: "chart " + (opts.kind || "") }, el("h3", { text: chart.title }), svg, legend);
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
  return el("div", { class: "chart" }, el("h3", { text: title }), svg, legend);
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
function at(run) { return [Math.min(state.layer, run.layers - 1), Math.min(state.head, run.heads - 1)]; }

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
  const grid = el("div", { class: "grid", style: `grid-template-columns: repeat(${run.heads}, auto)` });
  for (let l = 0; l < run.layers; l++) for (let h = 0; h < run.heads; h++) {
    const c = el("canvas", { class: "heatmap", "data-layer": l, "data-head": h });
    drawMap(c, run.weights[l][h]);
    const cell = el("div", { class: "cell" + (l === L && h === H ? " on" : "") }, c, `L${l} H${h}`);
    cell.addEventListener("click", () => { state.layer = l; state.head = h; render(); });
    grid.append(cell);
  }
  return el("div", { class: "panel" },
    el("h3", { text: `Attention A = ${run.normalize === "softmax" ? "softmax_row(S + M)" : run.normalize + "(S + M)"}: layer ${L}, head ${H}` }),
    el("p", { class: "why", text: "Rows are queries, columns keys; grey cells are masked (a key after its query). Hover a token or a cell: the keys that query reads, weights to 4 decimals. Colour: √weight, white 0 to blue 1." }),
    strip, el("div", { class: "reads" }), big,
    el("h3", { text: "Every layer (rows) and head (columns); click one" }), grid);
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
  panel.append(el("p", { class: "why", text: `The prompt continued greedily to ${lv.factor}× the trained context (${run.context} tokens), layer ${L}, head ${H}; long maps pooled into blocks for drawing.` }));
  const pair = el("div", { class: "pair" });
  for (const name of names) {
    const v = lv.views[name], c = el("canvas", { class: "longmap", "data-view": name });
    drawPooled(c, v.pictures[L][H], v.cells);
    c.addEventListener("mousemove", (ev) => {
      const box = c.getBoundingClientRect(), q = Math.floor((ev.clientY - box.top) / box.height * v.cells);
      const k = Math.floor((ev.clientX - box.left) / box.width * v.cells);
      showTip(ev, `queries ${q * v.block}–${Math.min(v.tokens, (q + 1) * v.block) - 1}, keys ${k * v.block}–${Math.min(v.tokens, (k + 1) * v.block) - 1}`);
    });
    c.addEventListener("mouseleave", hideTip);
    pair.append(el("figure", {}, c, el("figcaption", { text: `${name}: ${v.tokens} tokens, entropy ${v.entropy[L][H].toFixed(3)} nats` })));
  }
  panel.append(pair);
  const heads = [...Array(run.heads).keys()];
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
  const main = document.getElementById("runs"); main.replaceChildren();
  DATA.runs.forEach((run, r) => {
    const sec = el("section", { class: "run", "data-run": r },
      el("h2", { text: run.name }),
      el("p", { class: "meta", text: `${run.scheme} positions, ${run.normalize}, ${run.layers} layers × ${run.heads} heads, trained context ${run.context}, step ${run.step}` }),
      el("div", { class: "panels" }, attentionPanel(run, r), signalPanel(run),
        DATA.kind === "run" ? longPanel(run) : null, taskPanel(run)));
    main.append(sec);
    showQuery(r, state.query[r] === undefined ? run.tokens.length - 1 : state.query[r]);
  });
  const curves = document.getElementById("curves"); curves.replaceChildren();
  for (const chart of DATA.curves) curves.append(lineChart(chart, { width: 520, height: 280, kind: "curve" }));
  document.body.dataset.version = state.version;
}

function setup() {
  const first = DATA.runs[0], controls = document.getElementById("controls");
  const layers = Math.max(...DATA.runs.map((r) => r.layers)), heads = Math.max(...DATA.runs.map((r) => r.heads));
  const pick = (id, n, name) => {
    const s = el("select", { id }, ...[...Array(n).keys()].map((i) => el("option", { value: i, text: `${name} ${i}` })));
    s.addEventListener("change", () => { state[id] = +s.value; render(); });
    return s;
  };
  controls.append(el("label", { text: "Show" }), pick("layer", layers, "layer"), pick("head", heads, "head"));
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
