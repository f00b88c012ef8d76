// One merge: status and live progress, bytes against the full read, the omission bound,
// per-expert bytes, the heatmap of what it read, and its manifest.

import {get} from "./api.js";
import {requestOf} from "./frontier.js";
import {heatmap} from "./heatmap.js";
import {budgetText, progressOf, readShare} from "./merges.js";
import {bytes, download, encodeState, errorBox, every, fill, h, int, lineageLink, link, num,
        pct, seconds, table, when} from "./ui.js";

function facts(pairs) {
  return h("dl", {class: "facts"}, pairs.filter(Boolean).map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
}

export function boundText(plan) {
  if (!plan) return "–";
  if (plan.omission_bound === null || plan.omission_bound === undefined) {
    return plan.omission_bound_note || "no bound";
  }
  return `‖M_full − M‖₂ ≤ ${num(plan.omission_bound_l2)} (block-wise), ≤ ${num(plan.omission_bound)} (sum)`;
}

/** The plan's predicted deviation (docs/deviation.md), or why there is none. */
export function deviationText(plan) {
  if (!plan) return "–";
  const d = plan.predicted_deviation;
  if (d === null || d === undefined) return "none (no bound)";
  return `${num(d)} of the full merge's update (bound: ${num(plan.omission_bound_l2)} of ${num(plan.update_bound_l2)})`;
}

function summary(m) {
  const plan = m.plan || {};
  return facts([
    ["Status", h("span", {id: "merge-status"}, m.status)],
    ["Progress", h("span", {id: "merge-progress"}, progressOf(m))],
    ["Operator", `${m.operator} ${JSON.stringify(m.params)}`],
    ["Base", lineageLink(m.base)],
    ["Output", m.output_name ? h("span", {}, lineageLink(m.output_name), ` at ${m.output_path ?? "(not yet published)"}`) : "–"],
    ["Budget", `${budgetText(m)} = ${bytes(m.budget_bytes)}`],
    ["Expert bytes", readShare(m)],
    ["Base bytes read", bytes(m.base_bytes_read)],
    ["Blocks selected", plan.selected_blocks === undefined ? "–" : `${int(plan.selected_blocks)} of ${int(plan.candidate_blocks)} candidates`],
    ["Omission bound", h("span", {id: "merge-bound"}, boundText(m.plan))],
    ["Predicted deviation", h("span", {id: "merge-deviation"}, deviationText(m.plan))],
    ["Plan hash", h("code", {}, m.plan_hash ?? "–")],
    ["Times", `plan ${seconds(m.plan_seconds)}, execute ${seconds(m.exec_seconds)}; created ${when(m.created_at)}, finished ${when(m.finished_at)}`],
    m.error ? ["Error", h("span", {class: "error"}, m.error)] : null,
  ]);
}

function expertTable(m) {
  const planned = Object.fromEntries(((m.plan && m.plan.experts) || []).map((e) => [e.model, e]));
  const rows = m.experts.map((e) => ({...e, plan: planned[e.model] || {}}));
  return table("Bytes per expert", [
    {label: "Expert", render: (e) => lineageLink(e.model)},
    {label: "Weight", num: true, render: (e) => num(e.weight)},
    {label: "Density", num: true, render: (e) => num(e.density)},
    {label: "Blocks selected", num: true, render: (e) => e.plan.selected_blocks === undefined ? "–" : `${int(e.plan.selected_blocks)} / ${int(e.plan.candidate_blocks)}`},
    {label: "Full read", num: true, render: (e) => bytes(e.plan.full_read_bytes)},
    {label: "Planned", num: true, render: (e) => bytes(e.planned_bytes)},
    {label: "Read", num: true, render: (e) => bytes(e.bytes_read)},
    {label: "Read of its full read", num: true, render: (e) => e.plan.full_read_bytes ? pct((e.bytes_read ?? e.planned_bytes) / e.plan.full_read_bytes) : "–"},
  ], rows, {id: "experts-table"});
}

async function manifestSection(m) {
  const man = await get(`/v1/merges/${encodeURIComponent(m.id)}/manifest`);
  const text = JSON.stringify(man, null, 2);
  return h("section", {},
    h("h2", {}, "Manifest"),
    h("button", {type: "button", onclick: () => download(`${m.id}-manifest.json`, "application/json", text)},
      "Download manifest.json"),
    h("details", {}, h("summary", {}, `manifest.json (${int(text.length)} characters)`), h("pre", {}, text)));
}

export async function renderMerge(main, id) {
  const head = h("div");
  const shares = h("section", {}, h("h2", {}, "What it read"));
  const rest = h("div");
  fill(main, h("h1", {}, `Merge ${id}`), head, shares, rest);
  let drawn = null;  // the status the heatmap was drawn at
  return every(500, async () => {
    let m;
    try {
      m = await get(`/v1/merges/${encodeURIComponent(id)}`);
    } catch (err) {
      fill(head, errorBox(err));
      return false;
    }
    const frontier = `#/frontier?r=${encodeState(requestOf(m.request))}`;
    fill(head, summary(m), h("p", {class: "links"}, link(frontier, "Frontier of this request"),
         " · ", link(`#/sql?q=${encodeURIComponent(touchedSql(id))}`, "Its touched blocks in SQL")),
         expertTable(m));
    const done = m.status === "succeeded" || m.status === "failed";
    if (m.plan_hash && drawn !== m.status && (done || drawn === null)) {
      drawn = m.status;
      const s = await get(`/v1/merges/${encodeURIComponent(id)}/tensor-shares`);
      fill(shares, h("h2", {}, "What it read"), heatmap(s.tensors, s.experts, `Share of each tensor read by ${id}`));
    }
    if (done) {
      fill(rest, m.status === "succeeded" ? await manifestSection(m) : "");
      return false;
    }
    return true;
  });
}

function touchedSql(id) {
  return `SELECT model, tensor, count(*) AS blocks, sum(nbytes) AS bytes\nFROM touched_blocks\n` +
         `WHERE merge_id = '${id.replaceAll("'", "''")}'\nGROUP BY model, tensor\nORDER BY model, tensor`;
}
