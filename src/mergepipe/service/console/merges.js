// Merges: status, operator, budget, bytes read against the full read, times; live progress.

import {get} from "./api.js";
import {bar, bytes, errorBox, every, fill, h, lineageLink, mergeLink, pct, seconds, table,
        when} from "./ui.js";

export function budgetText(m) {
  const b = m.request && m.request.budget;
  if (b && b.fraction !== undefined && b.fraction !== null) return `${pct(b.fraction, 0)} of full read`;
  if (b && b.bytes !== undefined && b.bytes !== null) return bytes(b.bytes);
  return bytes(m.budget_bytes);
}

export function progressOf(m) {
  const p = m.progress || {done: 0, total: 0};
  const share = p.total ? p.done / p.total : m.status === "succeeded" ? 1 : 0;
  return h("span", {class: "progress"},
           h("progress", {max: 1, value: share, "aria-label": `progress of ${m.id}`}),
           ` ${pct(share, 0)} (${p.done}/${p.total} ${p.unit || "blocks"})`);
}

export function readShare(m) {
  if (m.full_read_bytes === null || m.full_read_bytes === undefined) return "–";
  const read = m.expert_bytes_read ?? m.planned_expert_bytes;
  const share = m.full_read_bytes ? read / m.full_read_bytes : 0;
  const what = m.expert_bytes_read === null ? "planned" : "read";
  return bar(share, `${bytes(read)} ${what} of ${bytes(m.full_read_bytes)} (${pct(share)})`);
}

const COLUMNS = [
  {label: "Merge", render: (m) => mergeLink(m.id)},
  {label: "Status", render: (m) => m.status === "running" || m.status === "queued"
    ? h("span", {}, `${m.status} `, progressOf(m)) : m.status + (m.error ? `: ${m.error}` : "")},
  {label: "Operator", key: "operator"},
  {label: "Output", render: (m) => m.output_name ? lineageLink(m.output_name) : "–"},
  {label: "Budget", render: budgetText},
  {label: "Expert bytes against the full read", render: readShare},
  {label: "Plan", num: true, render: (m) => seconds(m.plan_seconds)},
  {label: "Execute", num: true, render: (m) => seconds(m.exec_seconds)},
  {label: "Created", render: (m) => when(m.created_at)},
  {label: "Finished", render: (m) => when(m.finished_at)},
];

export async function renderMerges(main) {
  const list = h("div");
  fill(main, h("h1", {}, "Merges"),
       h("p", {}, "Newest first. Start one from the ", h("a", {href: "#/plan"}, "plan explorer"), "."),
       list);
  let last = null;
  return every(1000, async () => {
    try {
      const {merges} = await get("/v1/merges?limit=200");
      const text = JSON.stringify(merges);
      if (text === last) return true;  // re-render only on change: keeps the keyboard focus
      last = text;
      fill(list, merges.length ? table(`${merges.length} merge(s)`, COLUMNS, merges, {id: "merges-table"})
                               : h("p", {}, "No merges yet."));
    } catch (err) {
      fill(list, errorBox(err));
      return false;  // stop polling (a new token re-renders the page)
    }
    return true;
  });
}
