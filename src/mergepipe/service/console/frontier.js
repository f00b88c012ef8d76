// The speed-fidelity frontier of one request: planned bytes and bound across budgets (dry runs),
// and what the merges of the same request already run read, took and left different.

import {get, post} from "./api.js";
import {LAST_REQUEST, bytes, decodeState, errorBox, fill, h, int, link, mergeLink, num, pct, seconds,
        table} from "./ui.js";

export const BUDGETS = [0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0];

/** The part of a merge request that a frontier varies the budget of. */
export function requestOf(r) {
  return {base: r.base, operator: r.operator, params: r.params,
          experts: r.experts.map((e) => {
            const out = {model: e.model};
            if (e.weight !== null && e.weight !== undefined) out.weight = e.weight;
            if (e.density !== null && e.density !== undefined) out.density = e.density;
            return out;
          })};
}

const canon = (v) => JSON.stringify(v, Object.keys(v).sort());

/** Same base, operator, normalized params and (model, weight, density) of every expert. */
function sameRequest(m, plan) {
  if (m.base !== plan.base || m.operator !== plan.operator) return false;
  if (canon(m.params) !== canon(plan.params)) return false;
  if (m.experts.length !== plan.experts.length) return false;
  return m.experts.every((e, i) => e.model === plan.experts[i].model &&
    e.weight === plan.experts[i].weight && (e.density ?? null) === (plan.experts[i].density ?? null));
}

function yOf(p) {
  return p.omission_bound_l2 ?? null;
}

/** An SVG scatter: x = expert bytes (% of the full read), y = the bound (or the share of
 * candidate blocks left out: `yShare`, ticks in per cent). */
function chart(points, yLabel, yShare) {
  const W = 640, H = 300, L = 70, B = 44, T = 12, R = 16;
  const maxY = Math.max(1e-12, ...points.map((p) => p.y));
  const X = (x) => L + (W - L - R) * x;
  const Y = (y) => T + (H - T - B) * (1 - y / maxY);
  const svg = h("svg:svg", {viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img",
                            "aria-label": `${yLabel} against expert bytes read; the tables below hold the numbers`});
  svg.append(h("svg:line", {x1: L, y1: Y(0), x2: W - R, y2: Y(0), class: "axis"}),
             h("svg:line", {x1: L, y1: T, x2: L, y2: Y(0), class: "axis"}));
  for (const t of [0, 0.25, 0.5, 0.75, 1]) {
    svg.append(h("svg:text", {x: X(t), y: H - B + 16, "text-anchor": "middle", class: "tick"}, pct(t, 0)),
               h("svg:text", {x: L - 6, y: Y(t * maxY) + 4, "text-anchor": "end", class: "tick"},
                 yShare ? pct(t * maxY, 0) : num(t * maxY, 3)));
  }
  svg.append(h("svg:text", {x: (L + W) / 2, y: H - 6, "text-anchor": "middle", class: "label"},
               "expert bytes, share of the full read"),
             h("svg:text", {x: 14, y: (T + H - B) / 2, class: "label", transform: `rotate(-90 14 ${(T + H - B) / 2})`,
                            "text-anchor": "middle"}, yLabel));
  const planned = points.filter((p) => p.kind === "planned");
  svg.append(h("svg:polyline", {class: "frontier", points: planned.map((p) => `${X(p.x)},${Y(p.y)}`).join(" ")}));
  for (const p of points) {
    const mark = p.kind === "planned"
      ? h("svg:circle", {cx: X(p.x), cy: Y(p.y), r: 5, class: "planned"})
      : h("svg:rect", {x: X(p.x) - 5, y: Y(p.y) - 5, width: 10, height: 10, class: "realized"});
    mark.append(h("svg:title", {}, p.label));
    svg.append(mark);
  }
  return h("figure", {}, svg, h("figcaption", {}, "○ planned (dry run) · ■ merge already run"));
}

async function realizedRows(plan) {
  const {merges} = await get("/v1/merges?limit=1000");
  const runs = merges.filter((m) => sameRequest(m, plan));
  const ref = runs.find((m) => m.status === "succeeded" && m.budget_bytes >= m.full_read_bytes);
  for (const m of runs) {
    if (m.status !== "succeeded" || !ref) m.identical = null;
    else if (m.id === ref.id) m.identical = "reference (full budget)";
    else {
      const c = await get(`/v1/merges/${encodeURIComponent(m.id)}/identical-tensors?reference=${encodeURIComponent(ref.id)}`);
      m.identical = `${int(c.identical)} of ${int(c.tensors)}`;
    }
  }
  return {runs, ref};
}

const PLANNED = [
  {label: "Budget", render: (p) => pct(p.budget.fraction, 0)},
  {label: "Budget bytes", num: true, render: (p) => bytes(p.budget_bytes)},
  {label: "Planned bytes", num: true, render: (p) => bytes(p.planned_expert_bytes)},
  {label: "Of full read", num: true, render: (p) => pct(p.touched_ratio)},
  {label: "Blocks", num: true, render: (p) => `${int(p.selected_blocks)} / ${int(p.candidate_blocks)}`},
  {label: "Bound (block-wise)", num: true, render: (p) => num(p.omission_bound_l2)},
  {label: "Bound (sum)", num: true, render: (p) => num(p.omission_bound)},
];

const REALIZED = [
  {label: "Merge", render: (m) => mergeLink(m.id)},
  {label: "Status", key: "status"},
  {label: "Budget bytes", num: true, render: (m) => bytes(m.budget_bytes)},
  {label: "Expert bytes read", num: true, render: (m) => bytes(m.expert_bytes_read)},
  {label: "Of full read", num: true, render: (m) => m.expert_bytes_read === null ? "–" : pct(m.expert_bytes_read / m.full_read_bytes)},
  {label: "Execute", num: true, render: (m) => seconds(m.exec_seconds)},
  {label: "Recorded bound", num: true, render: (m) => num(m.plan && m.plan.omission_bound_l2)},
  {label: "Output tensors bit-identical to the full-budget run", render: (m) => m.identical ?? "–"},
];

const DEVIATION_NOTE = "Where the realized deviation comes from: the catalog does not record it. " +
  "||M_full − M||₂ needs the weights of both outputs; `mergepipe bench` and `mergepipe fidelity` load " +
  "them and compute it after the fact (benchmarks/deviation.py). What the catalog does record, and this " +
  "page shows, is each run's bytes read, time and bound, and per output tensor a content hash: the " +
  "tensors identical to the full-budget run's are exactly those the budget did not change.";

export async function renderFrontier(main, _arg, query) {
  const r = query.get("r") || sessionStorage.getItem(LAST_REQUEST);
  fill(main, h("h1", {}, "Speed-fidelity frontier"));
  if (!r) {
    main.append(h("p", {}, "Pick a request in the ", link("#/plan", "plan explorer"),
                         " or open a merge, then follow its “frontier” link."));
    return null;
  }
  const out = h("div", {"aria-busy": "true"}, h("p", {}, "Planning at each budget…"));
  main.append(out);
  try {
    const req = decodeState(r);
    const plans = [];
    for (const f of BUDGETS) plans.push(await post("/v1/plans", {...req, budget: {fraction: f}}));
    const {runs, ref} = await realizedRows(plans[0]);
    const bounded = plans[0].omission_bound !== null;
    const yLabel = bounded ? "omission bound (block-wise L2)" : "share of candidate blocks left out";
    const y = (p) => bounded ? yOf(p) : 1 - p.selected_blocks / Math.max(1, p.candidate_blocks);
    const shown = (v) => bounded ? num(v) : pct(v);
    const points = plans.map((p) => ({kind: "planned", x: p.touched_ratio, y: y(p),
      label: `budget ${pct(p.budget.fraction, 0)}: ${bytes(p.planned_expert_bytes)}, ${yLabel} ${shown(y(p))}`}));
    for (const m of runs.filter((m) => m.status === "succeeded" && m.plan)) {
      points.push({kind: "realized", x: m.expert_bytes_read / m.full_read_bytes, y: y(m.plan),
                   label: `${m.id}: read ${bytes(m.expert_bytes_read)} in ${seconds(m.exec_seconds)}`});
    }
    fill(out,
      h("p", {}, `${req.operator} of ${req.experts.map((e) => e.model).join(", ")} on ${req.base}; full read ${bytes(plans[0].full_read_bytes)}.`,
        bounded ? "" : ` ${plans[0].omission_bound_note}: the chart shows the share of the candidate blocks each budget leaves out instead.`),
      chart(points, yLabel, !bounded),
      table("Planned at each budget (POST /v1/plans; nothing read)", PLANNED, plans, {id: "frontier-planned"}),
      runs.length ? table("Merges of this request already run", REALIZED, runs, {id: "frontier-realized"})
                  : h("p", {}, "No merge of this request has run yet."),
      ref ? null : h("p", {}, "No full-budget run of this request yet: run one at 100% to compare outputs against it."),
      h("p", {class: "note"}, DEVIATION_NOTE));
  } catch (err) {
    fill(out, errorBox(err));
  }
  out.removeAttribute("aria-busy");
  return null;
}
