// tunesmith web UI: the shared helpers and the tabs. Each page lives in its own file (form.js, runs.js, ...)
// and registers itself in PAGES; data from the server is only ever inserted as text, never as HTML.
"use strict";

const PAGES = {};

async function api(path, body) {
  const options = body === undefined ? {} : {
    method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)};
  const response = await fetch("/api" + path, {credentials: "same-origin", ...options});
  const data = await response.json().catch(() => ({error: response.statusText}));
  if (!response.ok) {
    const error = new Error(data.error || response.statusText);
    error.data = data;
    error.status = response.status;
    throw error;
  }
  return data;
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (value !== undefined && value !== null && value !== false) node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function clock(seconds) {
  if (seconds === null || seconds === undefined || !isFinite(seconds)) return "–";
  const s = Math.round(seconds), h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
  return (h ? h + ":" + String(m).padStart(2, "0") : String(m)) + ":" + String(r).padStart(2, "0");
}

function fmt(value) {
  if (typeof value !== "number") return value === undefined ? "–" : String(value);
  if (value !== 0 && (Math.abs(value) < 1e-3 || Math.abs(value) >= 1e5)) return value.toExponential(2);
  return String(Math.round(value * 1e4) / 1e4);
}

function download(name, text) {
  const link = el("a", {href: URL.createObjectURL(new Blob([text], {type: "text/yaml"})), download: name});
  document.body.append(link);
  link.click();
  link.remove();
}

function showPage(name) {
  if (!PAGES[name]) name = "train";
  for (const section of document.querySelectorAll(".page")) section.hidden = section.id !== "page-" + name;
  for (const link of document.querySelectorAll("#tabs a")) link.classList.toggle("active", link.dataset.page === name);
  for (const [key, page] of Object.entries(PAGES)) {
    if (key === name) page.show && page.show();
    else page.hide && page.hide();
  }
}

window.addEventListener("hashchange", () => showPage(location.hash.slice(1).split("?")[0]));
window.addEventListener("DOMContentLoaded", async () => {
  for (const page of Object.values(PAGES)) page.init && await page.init();
  showPage(location.hash.slice(1).split("?")[0] || "train");
});
