// The layer x expert heatmap of the share of each tensor an access set reads, with its table view.
// Cells print their number (readable without colour), explain themselves on hover and focus,
// and are one tab stop: the arrow keys move between them.

import {bytes, fill, h, int, pct, table} from "./ui.js";

const LAYER = /^(.*?\.(?:layers|h|blocks|layer)\.)(\d+)\.(.+)$/;

/** Rows of the grid: one per layer (its tensors are the parts), one per other tensor. */
function layout(cells) {
  const rows = [];
  const byKey = new Map();
  const parts = [];
  for (const c of [...cells].sort((a, b) => a.ordinal - b.ordinal)) {
    const m = LAYER.exec(c.tensor);
    const key = m ? `layer ${m[2]}` : c.tensor;
    const part = m ? m[3] : null;
    if (part !== null && !parts.includes(part)) parts.push(part);
    if (!byKey.has(key)) {
      const row = {key, layer: m !== null, cells: new Map()};
      byKey.set(key, row);
      rows.push(row);
    }
    byKey.get(key).cells.set(`${c.model}\u0000${part}`, c);
  }
  return {rows, parts: parts.length ? parts : [null]};
}

export function shortName(part) {
  if (part === null) return "";
  const bits = part.split(".");
  const last = bits[bits.length - 1];
  return (last === "weight" || last === "bias") && bits.length > 1 ? bits[bits.length - 2] : last;
}

export function describe(c) {
  if (!c.tensor_bytes) return `${c.model} · ${c.tensor}: the expert stores no such tensor`;
  return `${c.model} · ${c.tensor}: ${int(c.read_blocks)} of ${int(c.blocks)} blocks, ` +
         `${bytes(c.read_bytes)} of ${bytes(c.tensor_bytes)} read (${pct(c.share)})`;
}

function cell(c, colspan, detail) {
  const td = h("td", {class: "cell", colspan: colspan > 1 ? String(colspan) : null, tabindex: "-1"});
  if (!c) {
    td.textContent = "";
    td.setAttribute("aria-label", "no tensor");
    return td;
  }
  const text = describe(c);
  td.title = text;
  td.setAttribute("aria-label", text);
  td.dataset.model = c.model;
  td.dataset.tensor = c.tensor;
  if (c.share === null) {
    td.textContent = "·";
    td.classList.add("none");
  } else {
    td.dataset.share = String(c.share);
    td.textContent = String(Math.round(100 * c.share));
    td.style.setProperty("--share", String(c.share));
    if (c.share > 0.55) td.classList.add("dark");
  }
  const show = () => fill(detail, text);
  td.addEventListener("mouseenter", show);
  td.addEventListener("focus", show);
  return td;
}

/** Roving focus: one tab stop, arrows move by row and column, Home/End to the row's ends. */
function keyboard(grid) {
  const first = grid.flat().find(Boolean);
  if (first) first.tabIndex = 0;
  const find = (el) => {
    for (let r = 0; r < grid.length; r++) {
      const c = grid[r].indexOf(el);
      if (c >= 0) return [r, c];
    }
    return null;
  };
  return (e) => {
    const at = find(e.target);
    if (!at) return;
    let [r, c] = at;
    const row = grid[r];
    if (e.key === "ArrowRight") { while (c < row.length - 1 && row[c] === e.target) c++; }
    else if (e.key === "ArrowLeft") {
      while (c > 0 && row[c] === e.target) c--;
      while (c > 0 && row[c - 1] === row[c]) c--;
    } else if (e.key === "ArrowDown") r = Math.min(grid.length - 1, r + 1);
    else if (e.key === "ArrowUp") r = Math.max(0, r - 1);
    else if (e.key === "Home") c = 0;
    else if (e.key === "End") c = row.length - 1;
    else return;
    e.preventDefault();
    const next = grid[r][Math.min(c, grid[r].length - 1)];
    if (next && next !== e.target) {
      e.target.tabIndex = -1;
      next.tabIndex = 0;
      next.focus();
    }
  };
}

function grid(cells, experts, caption, detail) {
  const {rows, parts} = layout(cells);
  const matrix = [];
  const body = rows.map((row) => {
    const tds = [];
    const line = [];
    for (const model of experts) {
      if (row.layer) {
        for (const part of parts) {
          const td = cell(row.cells.get(`${model}\u0000${part}`), 1, detail);
          tds.push(td);
          line.push(td);
        }
      } else {
        const td = cell(row.cells.get(`${model}\u0000null`), parts.length, detail);
        tds.push(td);
        for (let i = 0; i < parts.length; i++) line.push(td);
      }
    }
    matrix.push(line);
    const label = row.layer ? row.key : shortName(row.key.replace(/^model\./, ""));
    return h("tr", {}, h("th", {scope: "row", title: row.key}, label), tds);
  });
  const t = h("table", {class: "heatmap", onkeydown: keyboard(matrix)},
    h("caption", {}, caption),
    h("thead", {},
      h("tr", {}, h("th", {scope: "col", rowspan: "2"}, "layer / tensor"),
        experts.map((m) => h("th", {scope: "colgroup", colspan: String(parts.length), class: "expert"}, m))),
      h("tr", {}, experts.map(() => parts.map((p) =>
        h("th", {scope: "col", class: "part", title: p ?? ""}, shortName(p)))))),
    h("tbody", {}, body));
  return h("div", {class: "table-wrap heatmap-wrap"}, t);
}

const TABLE_COLUMNS = [
  {label: "Tensor", key: "tensor"},
  {label: "Expert", key: "model"},
  {label: "Blocks read", num: true, render: (c) => int(c.read_blocks)},
  {label: "Blocks", num: true, render: (c) => int(c.blocks)},
  {label: "Bytes read", num: true, render: (c) => int(c.read_bytes)},
  {label: "Bytes", num: true, render: (c) => int(c.tensor_bytes)},
  {label: "Share read", num: true, render: (c) => pct(c.share)},
];

/** The heatmap of `cells` (TensorShare objects) over `experts`, with a table-view toggle. */
export function heatmap(cells, experts, caption) {
  const detail = h("p", {class: "detail", "aria-live": "polite"},
                   "Hover or focus a cell (Tab, then the arrow keys) for its numbers.");
  const map = grid(cells, experts, caption, detail);
  const tableView = table(`${caption} (table view)`, TABLE_COLUMNS, cells, {class: "shares"});
  tableView.hidden = true;
  const toggle = h("button", {type: "button", "aria-pressed": "false", onclick: () => {
    const showTable = tableView.hidden;
    tableView.hidden = !showTable;
    map.hidden = showTable;
    detail.hidden = showTable;
    toggle.setAttribute("aria-pressed", String(showTable));
    fill(toggle, showTable ? "Show the heatmap" : "Show as a table");
  }}, "Show as a table");
  const legend = h("p", {class: "legend muted"},
    "Each cell: per cent of the expert's bytes of that tensor read (0 = skipped, 100 = read whole); ",
    h("span", {class: "swatch s0"}, "0"), h("span", {class: "swatch s50"}, "50"),
    h("span", {class: "swatch s100"}, "100"), "; · = the expert stores no such tensor.");
  return h("section", {class: "heatmap-section"}, h("div", {class: "toolbar"}, toggle), legend,
           map, detail, tableView);
}
