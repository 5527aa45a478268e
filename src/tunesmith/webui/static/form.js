// New run: the config form built from the schema (/api/form), validation as `tunesmith train` does it, YAML
// import (tunesmith's or LLaMA-Factory's) and export, and launching the run.
"use strict";

const form = {
  inputs: new Map(),  // key -> input/select
  messages: () => document.getElementById("form-messages"),

  async init() {
    const spec = await api("/form");
    document.getElementById("root-label").textContent = "runs root: " + spec.runs_root;
    const container = document.getElementById("config-form");
    for (const group of spec.groups) container.append(this.group(group));
    this.inputs.get("output_dir").value = spec.output_dir;
    this.markSet();
    this.bind();
  },

  group(group) {
    const fields = el("div", {class: "fields"}, group.fields.map((f) => this.field(f)));
    return el("fieldset", {class: "group", "data-group": group.name}, el("legend", {}, group.name),
      group.doc ? el("p", {class: "doc"}, group.doc) : null, fields);
  },

  field(f) {
    const id = "f-" + f.key;
    const input = f.choices ? this.select(f) : el("input", {type: "text", id, placeholder: "default: " + this.shown(f.default)});
    input.id = id;
    input.dataset.key = f.key;
    this.inputs.set(f.key, input);
    return el("div", {class: "field", "data-key": f.key, "data-text": (f.key + " " + f.doc).toLowerCase()},
      el("label", {for: id, title: f.kind + (f.nullable ? " or null" : "")}, f.key), input,
      el("p", {class: "doc"}, f.doc), el("div", {class: "error"}));
  },

  select(f) {
    const options = [el("option", {value: ""}, "default: " + this.shown(f.default))];
    for (const choice of f.choices) options.push(el("option", {value: String(choice)}, String(choice)));
    return el("select", {}, options);
  },

  shown(value) {
    if (value === null || value === undefined) return "unset";
    if (Array.isArray(value)) return value.length ? value.join(",") : "(empty)";
    return String(value);
  },

  values() {
    const out = {};
    for (const [key, input] of this.inputs) if (input.value.trim() !== "") out[key] = input.value;
    return {values: out, extra: document.getElementById("extra-keys").value};
  },

  setValue(key, text) {
    const input = this.inputs.get(key);
    if (input.tagName === "SELECT" && ![...input.options].some((o) => o.value === text)) {
      input.append(el("option", {value: text}, text));  // not an allowed value: kept so validation names it
    }
    input.value = text;
  },

  fill(imported) {
    for (const input of this.inputs.values()) input.value = "";
    for (const [key, text] of Object.entries(imported.values)) if (this.inputs.has(key)) this.setValue(key, text);
    document.getElementById("extra-keys").value = imported.extra || "";
    this.markSet();
  },

  markSet() {
    const onlySet = document.getElementById("only-set").checked;
    const filter = document.getElementById("field-filter").value.trim().toLowerCase();
    for (const box of document.querySelectorAll(".field")) {
      const set = this.inputs.get(box.dataset.key).value.trim() !== "";
      box.classList.toggle("set", set);
      box.hidden = (onlySet && !set) || (filter !== "" && !box.dataset.text.includes(filter));
    }
  },

  showProblems(problems, title) {
    for (const box of document.querySelectorAll(".field")) {
      box.classList.remove("bad");
      box.querySelector(".error").textContent = "";
    }
    for (const problem of problems) {
      for (const key of problem.keys || []) {
        const box = document.querySelector(`.field[data-key="${CSS.escape(key)}"]`);
        if (!box) continue;
        box.classList.add("bad");
        box.querySelector(".error").append(el("div", {}, problem.message));
      }
    }
    const area = this.messages();
    area.replaceChildren();
    if (!problems.length) return;
    area.append(el("div", {class: "messages bad"}, el("strong", {}, title),
      el("ul", {}, problems.map((p) => el("li", {}, p.message)))));
  },

  note(text, good = true, items = []) {
    this.messages().replaceChildren(el("div", {class: "messages " + (good ? "good" : "bad")}, text,
      items.length ? el("ul", {}, items.map((i) => el("li", {}, i))) : null));
  },

  async validate() {
    const result = await this.call("/config/validate", this.values());
    if (!result) return null;
    this.showProblems(result.problems, `${result.problems.length} problem(s), as \`tunesmith train\` reports them:`);
    if (result.ok) {
      const r = result.resolved;
      this.note(`Valid: stage ${r.stage}, ${r.finetuning_type} fine-tuning of ${r.model_name_or_path}, backend ` +
        `${r.backend}, into ${r.output_dir}.`);
    }
    return result;
  },

  async launch() {
    const button = document.getElementById("launch");
    button.disabled = true;
    try {
      const result = await api("/runs/launch", this.values());
      location.hash = "#runs?run=" + encodeURIComponent(result.id);
    } catch (error) {
      if (error.data && error.data.problems) this.showProblems(error.data.problems, "Not launched: " + error.message);
      else this.note("Not launched: " + error.message, false);
    } finally {
      button.disabled = false;
    }
  },

  async exportYaml(flavour) {
    const result = await this.call("/config/export", {...this.values(), flavour});
    if (!result) return;
    const preview = document.getElementById("export-preview");
    preview.textContent = result.text;
    preview.hidden = false;
    download(result.filename, result.text);
  },

  async importText(text) {
    const result = await this.call("/config/import", {text});
    if (!result) return;
    this.fill(result);
    const items = result.problems.concat(result.idle.length ? ["accepted without effect: " + result.idle.join(", ")] : []);
    this.showProblems([], "");
    this.note(`Imported ${Object.keys(result.values).length} key(s).`, result.problems.length === 0, items);
  },

  async call(path, body) {  // POST; a user error is shown above the form
    try {
      return await api(path, body);
    } catch (error) {
      const items = (error.data && error.data.problems) || [];
      this.note(error.message, false, items.map((p) => (typeof p === "string" ? p : p.message)));
      return null;
    }
  },

  bind() {
    const on = (id, event, fn) => document.getElementById(id).addEventListener(event, fn);
    on("validate", "click", () => this.validate());
    on("launch", "click", () => this.launch());
    on("export-ts", "click", () => this.exportYaml("tunesmith"));
    on("export-lf", "click", () => this.exportYaml("llamafactory"));
    on("import-paste-toggle", "click", () => {
      const box = document.getElementById("import-paste");
      box.hidden = !box.hidden;
    });
    on("import-apply", "click", () => this.importText(document.getElementById("import-text").value));
    on("import-file", "change", async (event) => {
      const file = event.target.files[0];
      if (file) await this.importText(await file.text());
      event.target.value = "";
    });
    on("field-filter", "input", () => this.markSet());
    on("only-set", "change", () => this.markSet());
    on("config-form", "input", () => this.markSet());
    on("config-form", "submit", (event) => event.preventDefault());
  },
};

PAGES.train = form;
