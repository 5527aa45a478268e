// Metric curves with uPlot (static/vendor/uPlot.iife.min.js, MIT). A run's rows ({step, loss, lr, ...}, as
// metrics.jsonl holds them) are grouped into panels; each panel is one chart with a curve per metric, or, when
// runs are compared, one chart per metric with a curve per run.
"use strict";

const PALETTE = ["#2459c7", "#d2691e", "#1d7a3a", "#a3329e", "#b3261e", "#00838f", "#7a6a00", "#5d4037"];
const NOT_PLOTTED = new Set(["step", "epoch"]);
const PANELS = [
  {title: "loss", test: (k) => k === "loss" || k === "eval_loss"},
  {title: "learning rate", test: (k) => k === "lr"},
  {title: "grad norm", test: (k) => k === "grad_norm"},
  {title: "tokens/s", test: (k) => k === "tokens_per_s"},
  {title: "reward", test: (k) => /^(eval_)?reward_/.test(k)},
  {title: "eval", test: (k) => k.startsWith("eval_")},
];

// metric -> Map(step -> value), from rows appended in order (a later row of a step wins)
class MetricStore {
  constructor() { this.series = new Map(); this.lastStep = 0; }
  add(rows) {
    for (const row of rows) {
      const step = row.step ?? 0;
      this.lastStep = Math.max(this.lastStep, step);
      for (const [key, value] of Object.entries(row)) {
        if (NOT_PLOTTED.has(key) || typeof value !== "number" || !isFinite(value)) continue;
        if (!this.series.has(key)) this.series.set(key, new Map());
        this.series.get(key).set(step, value);
      }
    }
  }
  keys() { return [...this.series.keys()]; }
}

// [{title, keys}] for the metrics a store holds: the known panels first, then one panel per other metric
function panelsFor(keys) {
  const left = new Set(keys), out = [];
  for (const panel of PANELS) {
    const mine = [...left].filter(panel.test);
    if (mine.length) out.push({title: panel.title, keys: mine});
    mine.forEach((k) => left.delete(k));
  }
  for (const key of [...left].sort()) out.push({title: key, keys: [key]});
  return out;
}

// uPlot's data: [steps, values of series 1, ...], aligned on the union of steps (null where one has none)
function aligned(maps) {
  const steps = [...new Set(maps.flatMap((m) => [...m.keys()]))].sort((a, b) => a - b);
  return [steps, ...maps.map((m) => steps.map((s) => (m.has(s) ? m.get(s) : null)))];
}

class Chart {
  constructor(parent, title) {
    this.box = el("div", {class: "chart", "data-title": title}, el("h3", {}, title));
    parent.append(this.box);
    this.plot = null;
    this.labels = "";
  }
  update(labels, data) {
    const signature = labels.join("\u0000");
    if (!this.plot || signature !== this.labels) this.build(labels, data);
    else this.plot.setData(data);
  }
  build(labels, data) {
    if (this.plot) this.plot.destroy();
    this.labels = labels.join("\u0000");
    const width = Math.max(340, (this.box.clientWidth || 440) - 12);
    const few = data[0].length < 40;
    this.plot = new uPlot({
      width, height: 210, scales: {x: {time: false}},
      series: [{label: "step"}, ...labels.map((label, i) => ({
        label, stroke: PALETTE[i % PALETTE.length], width: 1.6, spanGaps: true, points: {show: few}}))],
      axes: [{}, {size: 64, values: (u, values) => values.map(fmt)}],
    }, data, this.box);
  }
  remove() { if (this.plot) this.plot.destroy(); this.box.remove(); }
}

// The charts of one area (a run's panels, or the compare page), kept by title and updated in place
class ChartArea {
  constructor(container) { this.container = container; this.charts = new Map(); }
  draw(panels) {  // panels: [{title, labels, maps}]
    const wanted = new Set(panels.map((p) => p.title));
    for (const [title, chart] of this.charts) if (!wanted.has(title)) { chart.remove(); this.charts.delete(title); }
    for (const panel of panels) {
      if (!this.charts.has(panel.title)) this.charts.set(panel.title, new Chart(this.container, panel.title));
      this.charts.get(panel.title).update(panel.labels, aligned(panel.maps));
    }
  }
  clear() { this.draw([]); }
}

function runPanels(store) {
  return panelsFor(store.keys()).map((p) => ({
    title: p.title, labels: p.keys, maps: p.keys.map((k) => store.series.get(k))}));
}

function comparePanels(stores) {  // stores: [[run id, MetricStore]]
  const keys = [...new Set(stores.flatMap(([, s]) => s.keys()))];
  return panelsFor(keys).flatMap((p) => p.keys).map((key) => {
    const having = stores.filter(([, s]) => s.series.has(key));
    return {title: key, labels: having.map(([id]) => id), maps: having.map(([, s]) => s.series.get(key))};
  });
}
