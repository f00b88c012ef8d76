// SQL over the catalog (the server's read-only sandbox): results as a table, CSV and JSON.

import {post} from "./api.js";
import {announce, csvCell, download, errorBox, fill, h, int, table} from "./ui.js";

const EXAMPLES = {
  "Models": "SELECT name, kind, base, status, tensor_bytes FROM models ORDER BY name",
  "Merges": "SELECT merge_id, status, operator, budget_bytes, expert_bytes_read, full_read_bytes\nFROM merges ORDER BY created_at DESC",
  "Touched bytes per expert": "SELECT merge_id, model, count(*) AS blocks, sum(nbytes) AS bytes\nFROM touched_blocks GROUP BY merge_id, model ORDER BY merge_id, model",
  "Lineage": "SELECT child, parent, role, weight, merge_id FROM lineage ORDER BY child, role, parent",
};

export function toCsv(res) {
  return [res.columns, ...res.rows].map((r) => r.map(csvCell).join(",")).join("\r\n") + "\r\n";
}

export async function renderSql(main, _arg, query) {
  const text = h("textarea", {id: "sql-text", rows: 6, spellcheck: false, "aria-describedby": "sql-hint"});
  text.value = query.get("q") || EXAMPLES["Merges"];
  const out = h("div", {id: "sql-result", "aria-live": "polite"});
  let last = null;
  const run = async () => {
    fill(out, h("p", {}, "Running…"));
    try {
      last = await post("/v1/sql", {sql: text.value});
      const cols = last.columns.map((c, i) => ({label: c, render: (r) => r[i] === null ? "NULL" : typeof r[i] === "object" ? JSON.stringify(r[i]) : String(r[i])}));
      fill(out,
        h("p", {}, `${int(last.rows.length)} row(s)`, last.truncated ? " (truncated at the server's row limit)" : ""),
        h("div", {class: "toolbar"},
          h("button", {type: "button", onclick: () => download("result.csv", "text/csv", toCsv(last))}, "Download CSV"),
          h("button", {type: "button", onclick: () => download("result.json", "application/json",
            JSON.stringify({columns: last.columns, rows: last.rows, truncated: last.truncated}, null, 2))}, "Download JSON")),
        table("Result", cols, last.rows, {id: "sql-table"}));
      announce(`${last.rows.length} rows`);
    } catch (err) {
      fill(out, errorBox(err));
    }
  };
  text.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); run(); }
  });
  const examples = h("select", {id: "sql-examples", onchange: () => { if (examples.value) text.value = EXAMPLES[examples.value]; }},
    h("option", {value: ""}, "Examples…"), Object.keys(EXAMPLES).map((k) => h("option", {value: k}, k)));
  fill(main, h("h1", {}, "SQL"),
    h("form", {class: "card", onsubmit: (e) => { e.preventDefault(); run(); }},
      h("label", {for: "sql-text"}, "One read-only SELECT over the catalog"),
      text,
      h("small", {id: "sql-hint", class: "muted"},
        "Tables include models, files, tensors, blocks, block_stats, tensor_stats, merges, merge_experts, touched_blocks, " +
        "output_tensors, lineage. Ctrl+Enter runs. The server limits rows, time and result size."),
      h("div", {class: "toolbar"}, h("button", {type: "submit"}, "Run"), h("label", {for: "sql-examples", class: "visually-hidden"}, "Example queries"), examples)),
    out);
  return null;
}
