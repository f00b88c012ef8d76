// Models: kind, status, size, statistics, lineage depth; register (ingest) a checkpoint.

import {get, post} from "./api.js";
import {announce, bytes, errorBox, every, field, fill, h, int, lineageLink, mergeLink, num,
        pct, seconds, table} from "./ui.js";

function status(m) {
  if (m.status !== "ingesting" || !m.job) return m.status + (m.error ? `: ${m.error}` : "");
  const p = m.job.progress;
  const share = p.total ? p.done / p.total : 0;
  return h("span", {}, `ingesting (${m.job.status}) `,
           h("progress", {max: 1, value: share, "aria-label": `ingestion of ${m.name}`}),
           ` ${pct(share, 0)}`);
}

function statistics(m, s) {
  if (!m.base) return "base";
  if (!m.has_stats) return "header only (planned per tensor)";
  if (!s || s.delta_l2 === null) return "–";
  return `‖Δ‖₂ ${num(s.delta_l2)}, max |Δ| ${num(s.delta_max_abs)}, nonzero ${pct(s.delta_nnz / s.numel)}`;
}

const COLUMNS = (stats) => [
  {label: "Name", render: (m) => lineageLink(m.name)},
  {label: "Status", render: status},
  {label: "Kind", key: "kind"},
  {label: "Base", render: (m) => m.base ?? "–"},
  {label: "Size", num: true, render: (m) => bytes(m.tensor_bytes)},
  {label: "Tensors", num: true, render: (m) => int(m.n_tensors)},
  {label: "Blocks", num: true, render: (m) => int(stats[m.name]?.n_blocks)},
  {label: "Block size", num: true, render: (m) => bytes(m.block_bytes)},
  {label: "Delta statistics", render: (m) => statistics(m, stats[m.name])},
  {label: "Lineage depth", num: true, render: (m) => stats[m.name] ? lineageLink(m.name, String(stats[m.name].lineage_depth)) : "–"},
  {label: "Made by", render: (m) => m.source_merge ? mergeLink(m.source_merge) : "ingestion"},
  {label: "Ingest time", num: true, render: (m) => seconds(m.ingest_seconds)},
];

/** The ingestion form; -> {form, update(models)} (the base choices follow the model list). */
function ingestForm(onDone) {
  const name = h("input", {required: true, maxlength: 128, autocomplete: "off"});
  const path = h("input", {required: true, size: 40, autocomplete: "off"});
  const kind = h("select", {}, ["full", "delta", "lora"].map((k) => h("option", {value: k}, k)));
  const base = h("select");
  const update = (models) => {
    const keep = base.value;
    const bases = models.filter((m) => !m.base && m.status !== "failed").map((m) => m.name);
    fill(base, h("option", {value: ""}, "(none: register a base)"),
         bases.map((b) => h("option", {value: b, selected: b === keep}, b)));
  };
  const block = h("input", {type: "number", min: 1, step: 1, placeholder: "1048576"});
  const stats = h("input", {type: "checkbox", checked: true});
  const out = h("div", {class: "result", "aria-live": "polite"});
  const form = h("form", {class: "card", onsubmit: async (e) => {
    e.preventDefault();
    const body = {name: name.value.trim(), path: path.value.trim(), kind: kind.value,
                  stats: stats.checked};
    if (base.value) body.base = base.value;
    if (block.value && !base.value) body.block_bytes = Number(block.value);
    try {
      const job = await post("/v1/models", body);
      fill(out, h("p", {}, `Queued ingestion ${job.id} of ${job.model}.`));
      announce(`ingestion of ${job.model} queued`);
      name.value = "";
      path.value = "";
      onDone();
    } catch (err) {
      fill(out, errorBox(err));
    }
  }},
    h("h2", {}, "Register a checkpoint"),
    h("div", {class: "fields"},
      field("ingest-name", "Name", name),
      field("ingest-path", "Path", path, "a file or directory inside a data root of the server"),
      field("ingest-kind", "Kind", kind),
      field("ingest-base", "Base", base, "experts are registered against their base"),
      field("ingest-block", "Block bytes", block, "bases only; default 1 MiB"),
      h("div", {class: "field check"}, stats, h("label", {for: "ingest-stats"}, "compute delta statistics"))),
    h("button", {type: "submit"}, "Ingest"), out);
  stats.id = "ingest-stats";
  return {form, update};
}

export async function renderModels(main) {
  const list = h("div");
  const ingest = ingestForm(() => restart());
  fill(main, h("h1", {}, "Models"), list, ingest.form);
  let last = null;
  const load = async () => {
    try {
      const [{models}, st] = await Promise.all([get("/v1/models"), get("/v1/model-stats")]);
      const text = JSON.stringify([models, st]);
      if (text === last) return true;  // re-render only on change: keeps the keyboard focus
      last = text;
      const stats = Object.fromEntries(st.models.map((s) => [s.name, s]));
      fill(list, models.length ? table(`${models.length} model(s)`, COLUMNS(stats), models, {id: "models-table"})
                               : h("p", {}, "No models yet: register a base checkpoint below."));
      ingest.update(models);
    } catch (err) {
      fill(list, errorBox(err));
      return false;  // stop polling (a new token re-renders the page)
    }
    return true;
  };
  let poller = every(1000, load);
  const restart = () => { poller.stop(); poller = every(1000, load); };
  return {stop: () => poller.stop()};
}
