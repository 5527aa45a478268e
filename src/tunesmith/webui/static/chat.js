// Chat: talk to any model or checkpoint of the runs root; the reply streams in as server-sent events.
"use strict";

const chatPage = {
  history: [],  // {role, content, images: [data URLs]}
  pending: [],  // images attached to the next message
  controller: null,

  init() {
    const on = (id, event, fn) => document.getElementById(id).addEventListener(event, fn);
    on("chat-send", "click", () => this.send());
    on("chat-stop", "click", () => this.controller && this.controller.abort());
    on("chat-clear", "click", () => this.clear());
    on("chat-model", "change", () => this.clear());
    on("chat-image", "change", (event) => this.attach(event.target));
    on("chat-text", "keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); this.send(); }
    });
  },

  async show() {
    const wanted = new URLSearchParams(location.hash.split("?")[1] || "").get("model");
    const models = await fillModelSelect(document.getElementById("chat-model"), wanted);
    document.getElementById("chat-note").textContent = models.length ? "" :
      "No model in the runs root yet: a run's output_dir holds one once it has saved.";
  },

  clear() {
    this.history = [];
    this.pending = [];
    document.getElementById("chat-log").replaceChildren();
    document.getElementById("chat-images").replaceChildren();
  },

  async attach(input) {
    for (const file of input.files) {
      const url = await new Promise((resolve, reject) => {
        const reader = new FileReader();
        reader.onload = () => resolve(reader.result);
        reader.onerror = () => reject(reader.error);
        reader.readAsDataURL(file);
      });
      this.pending.push(url);
      document.getElementById("chat-images").append(el("img", {src: url, alt: file.name}));
    }
    input.value = "";
  },

  bubble(role, text, images = []) {
    const node = el("div", {class: "msg " + role}, images.map((src) => el("img", {src, alt: "image"})), el("span", {}, text));
    const log = document.getElementById("chat-log");
    log.append(node);
    log.scrollTop = log.scrollHeight;
    return node.querySelector("span");
  },

  request() {
    const number = (id) => Number(document.getElementById(id).value);
    return {model: document.getElementById("chat-model").value, messages: this.history,
      system: document.getElementById("chat-system").value, max_new_tokens: number("chat-max"),
      temperature: number("chat-temp"), top_p: number("chat-top-p")};
  },

  async send() {
    const box = document.getElementById("chat-text");
    const text = box.value.trim();
    if ((!text && !this.pending.length) || this.controller) return;
    this.history.push({role: "user", content: text, images: this.pending});
    this.bubble("user", text, this.pending);
    box.value = "";
    this.pending = [];
    document.getElementById("chat-images").replaceChildren();
    const reply = this.bubble("assistant", "…");
    this.busy(true);
    try {
      const answer = await this.stream(reply);
      this.history.push({role: "assistant", content: answer, images: []});
    } catch (error) {
      reply.parentNode.classList.add("error");
      reply.textContent = error.name === "AbortError" ? reply.textContent + " [stopped]" : error.message;
      this.history.pop();  // the question goes again with the next message
    } finally {
      this.busy(false);
    }
  },

  busy(on) {
    this.controller = on ? new AbortController() : null;
    document.getElementById("chat-send").disabled = on;
    document.getElementById("chat-stop").hidden = !on;
  },

  async stream(reply) {
    const response = await fetch("/api/chat", {method: "POST", credentials: "same-origin",
      headers: {"Content-Type": "application/json"}, body: JSON.stringify(this.request()),
      signal: this.controller.signal});
    if (!response.ok) {
      const data = await response.json().catch(() => ({}));
      throw new Error(data.error || (data.detail && JSON.stringify(data.detail)) || response.statusText);
    }
    const reader = response.body.getReader(), decoder = new TextDecoder();
    let buffer = "", text = "";
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, {stream: true});
      const events = buffer.split("\n\n");
      buffer = events.pop();
      for (const event of events) {
        const data = JSON.parse(event.replace(/^data: /, ""));
        if (data.error) throw new Error(data.error);
        if (data.delta) text += data.delta;
        if (data.done) text = data.text;
        reply.textContent = text || (data.done ? "(an empty reply: the model ended its turn at once)" : "…");
      }
    }
    return text;
  },
};

PAGES.chat = chatPage;
