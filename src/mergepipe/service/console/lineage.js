// Lineage as a graph: ancestors to the left, descendants to the right, parent -> child edges
// labelled with role and weight (a dashed line is the base, a solid one an expert); with a table.

import {get} from "./api.js";
import {errorBox, fill, h, lineageLink, mergeLink, num, table} from "./ui.js";

/** Columns: the model at 0, ancestors at -depth, descendants at +depth. */
function place(name, ancestors, descendants) {
  const col = new Map([[name, 0]]);
  for (const e of ancestors) {
    if (!col.has(e.child)) col.set(e.child, -(e.depth - 1));
    if (!col.has(e.parent)) col.set(e.parent, -e.depth);
  }
  for (const e of descendants) {
    if (!col.has(e.parent)) col.set(e.parent, e.depth - 1);
    if (!col.has(e.child)) col.set(e.child, e.depth);
  }
  const cols = [...new Set(col.values())].sort((a, b) => a - b);
  const byCol = new Map(cols.map((c) => [c, [...col].filter(([, v]) => v === c).map(([n]) => n).sort()]));
  return {cols, byCol};
}

const NODE_W = 150, NODE_H = 34, GAP_X = 120, GAP_Y = 22, PAD = 16;

function graph(name, edges, ancestors, descendants) {
  const {cols, byCol} = place(name, ancestors, descendants);
  const pos = new Map();
  const rows = Math.max(...[...byCol.values()].map((v) => v.length));
  cols.forEach((c, i) => byCol.get(c).forEach((n, j) => {
    const offset = (rows - byCol.get(c).length) * (NODE_H + GAP_Y) / 2;
    pos.set(n, {x: PAD + i * (NODE_W + GAP_X), y: PAD + offset + j * (NODE_H + GAP_Y)});
  }));
  const W = PAD * 2 + cols.length * NODE_W + (cols.length - 1) * GAP_X;
  const H = PAD * 2 + rows * NODE_H + (rows - 1) * GAP_Y;
  const svg = h("svg:svg", {viewBox: `0 0 ${W} ${H}`, width: W, height: H, class: "lineage", role: "group",
                            "aria-label": `lineage of ${name}: ${pos.size} models, ${edges.length} edges`});
  for (const e of edges) {
    const a = pos.get(e.parent), b = pos.get(e.child);
    if (!a || !b) continue;
    const x1 = a.x + NODE_W, y1 = a.y + NODE_H / 2, x2 = b.x, y2 = b.y + NODE_H / 2;
    const label = e.role === "base" ? "base" : `w ${num(e.weight, 3)}`;
    const line = h("svg:path", {d: `M${x1},${y1} C${x1 + GAP_X / 2},${y1} ${x2 - GAP_X / 2},${y2} ${x2},${y2}`,
                                class: `edge ${e.role}`, "marker-end": "url(#arrow)"});
    line.append(h("svg:title", {}, `${e.parent} → ${e.child}: ${e.role}${e.weight === null ? "" : `, weight ${e.weight}`} (${e.merge_id})`));
    // the label sits by its parent, where edges of one child have not converged yet
    svg.append(line, h("svg:text", {x: x1 + 8, y: y1 - 5, "text-anchor": "start",
                                    class: "edge-label", "data-edge": `${e.parent}>${e.child}`}, label));
  }
  for (const [n, p] of pos) {
    const a = h("svg:a", {href: `#/lineage/${encodeURIComponent(n)}`, class: n === name ? "node self" : "node",
                          "data-node": n, "aria-label": n === name ? `${n} (this model)` : `lineage of ${n}`});
    a.append(h("svg:rect", {x: p.x, y: p.y, width: NODE_W, height: NODE_H, rx: 6}),
             h("svg:text", {x: p.x + NODE_W / 2, y: p.y + NODE_H / 2 + 5, "text-anchor": "middle"},
               n.length > 20 ? `${n.slice(0, 19)}…` : n));
    svg.append(a);
  }
  const defs = h("svg:defs", {}, h("svg:marker", {id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5,
    markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse"}, h("svg:path", {d: "M0,0 L10,5 L0,10 z"})));
  svg.prepend(defs);
  return h("div", {class: "graph-wrap"}, svg);
}

const EDGE_COLUMNS = [
  {label: "Direction", render: (e) => e.direction},
  {label: "Depth", num: true, key: "depth"},
  {label: "Child", render: (e) => lineageLink(e.child)},
  {label: "Parent", render: (e) => lineageLink(e.parent)},
  {label: "Role", key: "role"},
  {label: "Weight", num: true, render: (e) => num(e.weight)},
  {label: "Merge", render: (e) => mergeLink(e.merge_id)},
];

export async function renderLineage(main, name) {
  fill(main, h("h1", {}, `Lineage of ${name}`));
  try {
    const lin = await get(`/v1/lineage/${encodeURIComponent(name)}`);
    const edges = [...lin.ancestors.map((e) => ({...e, direction: "ancestor"})),
                   ...lin.descendants.map((e) => ({...e, direction: "descendant"}))];
    main.append(h("p", {}, `${lin.ancestors.length} ancestor edge(s), ${lin.descendants.length} descendant edge(s); ` +
                          `depth ${lin.depth}. Parents on the left; dashed: base, solid: expert with its weight.`));
    main.append(edges.length ? graph(name, edges, lin.ancestors, lin.descendants)
                             : h("p", {}, `${name} was ingested and has not been merged yet.`));
    if (edges.length) main.append(table("Edges", EDGE_COLUMNS, edges, {id: "lineage-table"}));
  } catch (err) {
    main.append(errorBox(err));
  }
  return null;
}
