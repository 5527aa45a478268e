// Runs: every run of the runs root, one run's live curves, progress, ETA, log and config; Compare: curves of
// several runs overlaid. Metrics are fetched incrementally (the bytes after the offset already read).
"use strict";

const POLL_MS = 2000;

// One run's metrics as they grow: fetches only what was written since the last call
class RunFeed {
  constructor(id) { this.id = id; this.offset = 0; this.store = new MetricStore(); }
  async poll() {
    if (this.polling) return;  // a slow answer is not asked for twice
    this.polling = true;
    try {
      const data = await api(`/run/metrics?run=${encodeURIComponent(this.id)}&offset=${this.offset}`);
      if (data.reset) this.store = new MetricStore();  // the file was rewritten (a resumed run)
      this.store.add(data.rows);
      this.offset = data.offset;
    } finally {
      this.polling = false;
    }
  }
}

function progressText(run) {
  const p = run.progress || {};
  if (p.step === null || p.step === undefined) return "not started";
  const total = p.total ? ` / ${p.total}` : "";
  const pct = p.percentage !== null && p.percentage !== undefined ? ` (${p.percentage}%)` : "";
  const eta = run.status === "running" && p.eta_s !== null ? `, ETA ${clock(p.eta_s)}` : "";
  return `step ${p.step}${total}${pct}, elapsed ${clock(p.elapsed_s)}${eta}`;
}

const runsPage = {
  selected: null, feed: null, logOffset: 0, timer: null, charts: null,

  init() {
    this.charts = new ChartArea(document.getElementById("run-charts"));
    document.getElementById("run-stop").addEventListener("click", () => this.stop());
    document.getElementById("run-chat").addEventListener("click", () => {
      location.hash = "#chat?model=" + encodeURIComponent(this.selected);
    });
  },

  async show() {
    const wanted = new URLSearchParams(location.hash.split("?")[1] || "").get("run");
    if (wanted && wanted !== this.selected) this.select(wanted);  // at once: nothing of the last run shows
    await this.tick();
    clearInterval(this.timer);
    this.timer = setInterval(() => this.tick(), POLL_MS);
  },

  hide() { clearInterval(this.timer); this.timer = null; },

  async tick() {
    await this.refreshList();
    if (this.selected) await this.refreshDetail();
  },

  async refreshList() {
    const data = await api("/runs");
    const body = document.querySelector("#runs-table tbody");
    body.replaceChildren(...data.runs.map((run) => el("tr", {
      "data-run": run.id, class: run.id === this.selected ? "selected" : "", onclick: () => this.select(run.id)},
      el("td", {}, run.id), el("td", {}, el("span", {class: "badge " + run.status}, run.status)),
      el("td", {}, run.progress.total ? `${run.progress.step ?? 0}/${run.progress.total}` : (run.progress.step ?? "–")),
      el("td", {}, fmt(run.latest.loss)))));
    document.getElementById("runs-empty").hidden = data.runs.length > 0;
    this.runs = data.runs;
  },

  select(id) {
    this.selected = id;
    this.feed = new RunFeed(id);
    this.logOffset = 0;
    this.charts.clear();
    document.getElementById("run-log").textContent = "";
    document.getElementById("run-detail").hidden = false;
    document.getElementById("run-title").textContent = id;
    this.showStatus({status: "loading", progress: {}, config: "", config_file: null});  // nothing of the last run
    for (const row of document.querySelectorAll("#runs-table tbody tr")) {
      row.classList.toggle("selected", row.dataset.run === id);
    }
    history.replaceState(null, "", "#runs?run=" + encodeURIComponent(id));
    this.refreshDetail();
  },

  async refreshDetail() {
    if (this.refreshing) return;  // one refresh at a time: polls of one offset never overlap
    this.refreshing = true;
    try {
      const id = this.selected, feed = this.feed;
      const [info, , log] = await Promise.all([api(`/run/info?run=${encodeURIComponent(id)}`), feed.poll(),
        api(`/run/log?run=${encodeURIComponent(id)}&offset=${this.logOffset}`)]);
      if (id !== this.selected) return;  // another run was picked meanwhile
      this.charts.draw(runPanels(feed.store));
      this.showStatus(info);
      this.showLog(log);
    } finally {
      this.refreshing = false;
    }
  },

  showStatus(info) {
    const state = document.getElementById("run-state");
    state.textContent = info.status;
    state.className = "badge " + info.status;
    document.getElementById("run-bar").style.width = (info.progress.percentage || (info.status === "finished" ? 100 : 0)) + "%";
    document.getElementById("run-progress").textContent = progressText(info);
    document.getElementById("run-stop").hidden = info.status !== "running";
    document.getElementById("run-chat").hidden = info.status !== "finished";
    document.getElementById("run-config-file").textContent = info.config_file ? "(" + info.config_file + ")" : "";
    document.getElementById("run-config").textContent = info.config || "no config file in this run's folder";
  },

  showLog(data) {
    const log = document.getElementById("run-log");
    if (!data.exists) {
      log.textContent = "no train.log: this run was not launched from the web UI (its log went to its terminal)";
      return;
    }
    if (data.reset || this.logOffset === 0) log.textContent = "";
    const atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 8;
    log.append(data.text);
    this.logOffset = data.offset;
    if (atBottom) log.scrollTop = log.scrollHeight;
  },

  async stop() {
    try {
      await api("/run/stop", {run: this.selected});
    } catch (error) {
      alert(error.message);
    }
    await this.refreshDetail();
  },
};

const comparePage = {
  feeds: new Map(), timer: null, charts: null,

  init() { this.charts = new ChartArea(document.getElementById("compare-charts")); },

  async show() {
    await this.refreshPicks();
    await this.tick();
    clearInterval(this.timer);
    this.timer = setInterval(() => this.tick(), POLL_MS);
  },

  hide() { clearInterval(this.timer); this.timer = null; },

  async refreshPicks() {
    const data = await api("/runs");
    const picks = document.getElementById("compare-picks");
    const known = new Set([...picks.querySelectorAll("input")].map((i) => i.value));
    for (const run of data.runs) {
      if (known.has(run.id)) continue;
      const box = el("input", {type: "checkbox", value: run.id, onchange: () => this.toggle(box)});
      picks.append(el("label", {}, box, " " + run.id));
    }
  },

  toggle(box) {
    if (box.checked) this.feeds.set(box.value, new RunFeed(box.value));
    else this.feeds.delete(box.value);
    this.tick();
  },

  async tick() {
    await Promise.all([...this.feeds.values()].map((f) => f.poll()));
    this.charts.draw(comparePanels([...this.feeds.entries()].map(([id, feed]) => [id, feed.store])));
    await this.refreshPicks();
  },
};

PAGES.runs = runsPage;
PAGES.compare = comparePage;
