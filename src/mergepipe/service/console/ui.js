// DOM helpers shared by the pages: elements, numbers, tables, downloads, announcements.

/** h("td", {class: "num", title}, "text", child) -> an element; attributes set as properties
 *  where the DOM has them (never a style attribute: the console's CSP forbids inline styles). */
export function h(tag, attrs = {}, ...children) {
  const svg = tag.startsWith("svg:");
  const el = svg ? document.createElementNS("http://www.w3.org/2000/svg", tag.slice(4))
                 : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.setAttribute("class", v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (!svg && k in el && typeof v !== "string") el[k] = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

/** Replace the children of `el`. */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

export function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = Number(n), u = 0;
  while (Math.abs(v) >= 1024 && u < units.length - 1) { v /= 1024; u += 1; }
  return u === 0 ? `${v} B` : `${v.toFixed(v >= 100 ? 0 : v >= 10 ? 1 : 2)} ${units[u]}`;
}

export function int(n) {
  return n === null || n === undefined ? "–" : Number(n).toLocaleString("en-US");
}

export function pct(x, digits = 1) {
  return x === null || x === undefined || Number.isNaN(x) ? "–" : `${(100 * x).toFixed(digits)}%`;
}

export function num(x, digits = 4) {
  if (x === null || x === undefined) return "–";
  const v = Number(x);
  return v !== 0 && (Math.abs(v) < 1e-3 || Math.abs(v) >= 1e5) ? v.toExponential(3)
                                                                 : v.toPrecision(digits);
}

export function seconds(s) {
  return s === null || s === undefined ? "–" : `${Number(s).toFixed(2)} s`;
}

export function when(iso) {
  return iso ? iso.replace("T", " ").slice(0, 19) : "–";
}

/** A table: columns [{key, label, num?, render?(row)}], rows of objects. */
export function table(caption, columns, rows, attrs = {}) {
  return h("div", {class: "table-wrap"}, h("table", attrs,
    h("caption", {}, caption),
    h("thead", {}, h("tr", {}, columns.map((c) =>
      h("th", {scope: "col", class: c.num ? "num" : null}, c.label)))),
    h("tbody", {}, rows.map((r) => h("tr", {}, columns.map((c) =>
      h("td", {class: c.num ? "num" : null}, c.render ? c.render(r) : fmtCell(r[c.key]))))))));
}

export function fmtCell(v) {
  if (v === null || v === undefined) return "NULL";
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
}

/** A bar for a share in [0, 1], with the number printed beside it (readable without colour). */
export function bar(share, label) {
  const m = h("meter", {min: 0, max: 1, value: share ?? 0, title: label});
  return h("span", {class: "bar"}, m, " ", label);
}

/** Offer `text` as a file download. */
export function download(name, type, text) {
  const url = URL.createObjectURL(new Blob([text], {type}));
  const a = h("a", {href: url, download: name});
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}

/** Say something to screen readers (and keep it visible in the status line of the page). */
export function announce(text) {
  fill(document.getElementById("announce"), text);
}

/** An error box with the API's message (role alert). */
export function errorBox(err) {
  return h("p", {class: "error", role: "alert"}, `${err.status ? err.status + " " : ""}${err.message}`);
}

/** Escape a value for CSV (RFC 4180), neutralizing formulas as OWASP recommends: a text cell
 * beginning with =, +, -, @, a tab or a carriage return gets a leading single quote, so that a
 * spreadsheet shows it instead of evaluating it (a number, or text that is only a number such
 * as "-1.5e-3", is written as it is: it cannot be a formula). */
export function csvCell(v) {
  let s = v === null || v === undefined ? "" : typeof v === "object" ? JSON.stringify(v) : String(v);
  if (/^[=+\-@\t\r]/.test(s) && !/^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$/.test(s)) s = "'" + s;
  return /[",\r\n]/.test(s) ? `"${s.replaceAll('"', '""')}"` : s;
}

/** Base64url of a JSON value (to carry a request in the URL) and back. */
export function encodeState(obj) {
  const bytes_ = new TextEncoder().encode(JSON.stringify(obj));
  let s = "";
  for (const b of bytes_) s += String.fromCharCode(b);
  return btoa(s).replaceAll("+", "-").replaceAll("/", "_").replace(/=+$/, "");
}

export function decodeState(text) {
  const s = atob(text.replaceAll("-", "+").replaceAll("_", "/"));
  return JSON.parse(new TextDecoder().decode(Uint8Array.from(s, (c) => c.charCodeAt(0))));
}

/** Run `fn` now and every `ms` until it returns false or stop() is called; -> {stop}. */
export function every(ms, fn) {
  let timer = null, stopped = false;
  const tick = async () => {
    let again = true;
    try { again = (await fn()) !== false; } catch { again = true; }
    if (!stopped && again) timer = setTimeout(tick, ms);
  };
  tick();
  return {stop() { stopped = true; clearTimeout(timer); }};
}

/** A labelled form field: label + control (+ a hint), ids derived from `id`. */
export function field(id, label, control, hint) {
  control.id = id;
  if (hint) control.setAttribute("aria-describedby", `${id}-hint`);
  return h("div", {class: "field"}, h("label", {for: id}, label), control,
           hint ? h("small", {id: `${id}-hint`, class: "muted"}, hint) : null);
}

export const link = (href, text) => h("a", {href}, text);
export const mergeLink = (id) => link(`#/merge/${encodeURIComponent(id)}`, id);
export const lineageLink = (name, text) => link(`#/lineage/${encodeURIComponent(name)}`, text ?? name);

/** sessionStorage key of the plan explorer's last request (the frontier page's default). */
export const LAST_REQUEST = "mergepipe.request";
