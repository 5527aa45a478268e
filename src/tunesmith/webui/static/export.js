// Export: merge a run's LoRA (if any) and write a standalone model, as `tunesmith export` does.
"use strict";

async function fillModelSelect(select, wanted) {
  const data = await api("/models");
  const previous = wanted || select.value;
  select.replaceChildren(...data.models.map((m) => el("option", {value: m.id},
    m.id + (m.kind === "checkpoint" ? "  (checkpoint)" : "") + (m.adapter ? "  [LoRA]" : ""))));
  if (previous && data.models.some((m) => m.id === previous)) select.value = previous;
  return data.models;
}

const exportPage = {
  timer: null,

  init() {
    document.getElementById("export-start").addEventListener("click", () => this.start());
    document.getElementById("export-model").addEventListener("change", () => this.suggest());
  },

  async show() {
    await fillModelSelect(document.getElementById("export-model"));
    this.suggest();
    await this.refreshJobs();
  },

  hide() { clearInterval(this.timer); this.timer = null; },

  suggest() {
    const model = document.getElementById("export-model").value;
    if (model) document.getElementById("export-dir").value = model.replace(/\//g, "-") + "-export";
  },

  async start() {
    const message = document.getElementById("export-message");
    const body = {model: document.getElementById("export-model").value,
      export_dir: document.getElementById("export-dir").value, dtype: document.getElementById("export-dtype").value};
    try {
      const job = await api("/export", body);
      message.replaceChildren(el("div", {class: "messages good"}, `export #${job.id} started into ${job.export_dir}`));
    } catch (error) {
      message.replaceChildren(el("div", {class: "messages bad"}, error.message));
    }
    await this.refreshJobs();
  },

  async refreshJobs() {
    const data = await api("/export/jobs");
    document.querySelector("#export-jobs tbody").replaceChildren(...data.jobs.map((job) => el("tr", {},
      el("td", {}, job.id), el("td", {}, job.model), el("td", {}, job.export_dir), el("td", {}, job.dtype),
      el("td", {}, el("span", {class: "badge " + (job.state === "done" ? "finished" : job.state)}, job.state),
        job.error ? " " + job.error : "", job.state === "done" ? ` (${job.seconds.toFixed(1)} s)` : ""))));
    const busy = data.jobs.some((job) => job.state === "running");
    clearInterval(this.timer);
    this.timer = busy ? setInterval(() => this.refreshJobs(), POLL_MS) : null;
    if (!busy) await fillModelSelect(document.getElementById("export-model"));
  },
};

PAGES.export = exportPage;
