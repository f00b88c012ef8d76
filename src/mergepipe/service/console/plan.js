// The plan explorer: pick base, experts, operator and parameters, slide the budget and see the
// bytes, the bound and the heatmap of a dry run (POST /v1/plans) before anything is read; start
// the merge from there.

import {get, post} from "./api.js";
import {boundText, deviationText} from "./merge.js";
import {heatmap} from "./heatmap.js";
import {LAST_REQUEST, bytes, encodeState, errorBox, field, fill, h, int, link, num, pct,
        table} from "./ui.js";

function paramControl(p) {
  const id = `param-${p.name}`;
  let control;
  if (p.type === "bool") control = h("input", {type: "checkbox", checked: Boolean(p.default)});
  else if (p.choices.length) control = h("select", {}, p.choices.map((c) => h("option", {value: c, selected: c === p.default}, c)));
  else if (p.type === "float") control = h("input", {type: "number", step: "any", value: String(p.default)});
  else control = h("input", {value: String(p.default)});
  control.dataset.param = p.name;
  control.dataset.type = p.type;
  return p.type === "bool"
    ? h("div", {class: "field check"}, Object.assign(control, {id}), h("label", {for: id}, p.name), h("small", {class: "muted"}, ` ${p.help}`))
    : field(id, p.name, control, p.help);
}

function readParams(box) {
  const out = {};
  for (const c of box.querySelectorAll("[data-param]")) {
    if (c.dataset.type === "bool") out[c.dataset.param] = c.checked;
    else if (c.dataset.type === "float") { if (c.value !== "") out[c.dataset.param] = Number(c.value); }
    else out[c.dataset.param] = c.value;
  }
  return out;
}

// Fine-tuned experts are ticked; outputs of earlier merges (registered experts of the same base)
// are listed unticked, marked as merges, so that a plan does not merge a merge by default.
function expertRows(experts, withDensity) {
  return h("fieldset", {class: "experts"}, h("legend", {}, "Experts"),
    experts.length ? experts.map((m, i) => h("div", {class: "expert-row", "data-expert": m.name},
      h("input", {type: "checkbox", id: `use-${i}`, checked: !m.source_merge, "data-use": "1"}),
      h("label", {for: `use-${i}`}, m.name,
        m.source_merge ? h("span", {class: "small", "data-merge-output": m.source_merge}, ` (output of merge ${m.source_merge})`) : null),
      h("label", {for: `weight-${i}`, class: "small"}, "weight"),
      h("input", {type: "number", id: `weight-${i}`, step: "any", value: "1", "data-weight": "1", size: 5}),
      withDensity ? [h("label", {for: `density-${i}`, class: "small"}, "density"),
                     h("input", {type: "number", id: `density-${i}`, step: "0.01", min: "0.01", max: "1",
                                 placeholder: "global", "data-density": "1", size: 5})] : null))
                   : h("p", {}, "No ready experts of this base."));
}

function readExperts(box) {
  return [...box.querySelectorAll("[data-expert]")].filter((r) => r.querySelector("[data-use]").checked)
    .map((r) => {
      const e = {model: r.dataset.expert, weight: Number(r.querySelector("[data-weight]").value || 1)};
      const d = r.querySelector("[data-density]");
      if (d && d.value !== "") e.density = Number(d.value);
      return e;
    });
}

// The ranking the plan ordered blocks by: the one utility=auto chose and why, or the one asked for.
function rankingText(p) {
  const r = p.ranking;
  if (!r) return p.params.utility || "the operator's default";
  const why = r.regime === null ? "" : `: ${r.regime} updates, delta spread ${num(r.delta_spread)} (flat below ${num(r.flat_below)})`;
  return `${r.utility} (auto${why})`;
}

function planFacts(p) {
  return h("dl", {class: "facts", id: "plan-facts"},
    h("dt", {}, "Budget"), h("dd", {id: "plan-budget"}, `${bytes(p.budget_bytes)} (${int(p.budget_bytes)} bytes)`),
    h("dt", {}, "Planned expert bytes"), h("dd", {id: "plan-bytes"}, `${bytes(p.planned_expert_bytes)} (${int(p.planned_expert_bytes)} bytes) = ${pct(p.touched_ratio)} of the full read`),
    h("dt", {}, "Full read"), h("dd", {id: "plan-full"}, `${bytes(p.full_read_bytes)} (${int(p.full_read_bytes)} bytes)`),
    h("dt", {}, "Blocks"), h("dd", {}, `${int(p.selected_blocks)} of ${int(p.candidate_blocks)} candidates`),
    h("dt", {}, "Ranking"), h("dd", {id: "plan-ranking"}, rankingText(p)),
    h("dt", {}, "Omission bound"), h("dd", {id: "plan-bound"}, boundText(p)),
    h("dt", {}, "Predicted deviation"), h("dd", {id: "plan-deviation"}, deviationText(p)),
    h("dt", {}, "Plan hash"), h("dd", {}, h("code", {}, p.plan_hash.slice(0, 16))),
    p.fallback_experts.length ? [h("dt", {}, "Fallback"), h("dd", {}, `${p.fallback_experts.join(", ")}: ${p.fallback_order}`)] : null);
}

const EXPERT_COLUMNS = [
  {label: "Expert", key: "model"},
  {label: "Coefficient", num: true, render: (e) => num(e.coefficient)},
  {label: "Blocks", num: true, render: (e) => `${int(e.selected_blocks)} / ${int(e.candidate_blocks)}`},
  {label: "Planned", num: true, render: (e) => bytes(e.planned_bytes)},
  {label: "Full read", num: true, render: (e) => bytes(e.full_read_bytes)},
  {label: "Share", num: true, render: (e) => e.full_read_bytes ? pct(e.planned_bytes / e.full_read_bytes) : "–"},
];

export async function renderPlan(main) {
  fill(main, h("h1", {}, "Plan explorer"),
       h("p", {}, "Nothing is read until you start the merge: every change below is a dry run of the planner over the catalog."));
  let models, operators;
  try {
    [{models}, {operators}] = await Promise.all([get("/v1/models"), get("/v1/operators")]);
  } catch (err) {
    main.append(errorBox(err));
    return null;
  }
  const ready = models.filter((m) => m.status === "ready");
  const bases = ready.filter((m) => !m.base);
  if (!bases.length) {
    main.append(h("p", {}, "No ready base yet: register one on the ", link("#/models", "models page"), "."));
    return null;
  }
  const base = h("select", {}, bases.map((b) => h("option", {value: b.name}, b.name)));
  const op = h("select", {}, operators.map((o) => h("option", {value: o.name}, `${o.name}${o.additive ? " (bound)" : ""}`)));
  const expertsBox = h("div");
  const paramsBox = h("div", {class: "fields"});
  const slider = h("input", {type: "range", min: "1", max: "100", step: "1", value: "100"});
  const sliderOut = h("output", {for: "budget", id: "budget-out"}, "100% of the full read");
  const seed = h("input", {type: "number", min: "0", step: "1", value: "0"});
  const target = h("input", {type: "number", min: "0", max: "1", step: "0.01", value: "0.1", size: 5});
  const targetOut = h("div", {id: "target-result", "aria-live": "polite"});
  const outName = h("input", {maxlength: 128, autocomplete: "off"});
  const result = h("div", {id: "plan-result", "aria-live": "polite"});
  const mapSlot = h("div", {id: "plan-heatmap"});
  const started = h("div", {"aria-live": "polite"});
  const frontier = h("a", {href: "#/frontier"}, "Frontier of this request");
  const spec = () => operators.find((o) => o.name === op.value);

  const request = () => ({base: base.value, experts: readExperts(expertsBox), operator: op.value,
                          params: readParams(paramsBox)});
  const drawInputs = () => {
    fill(expertsBox, expertRows(ready.filter((m) => m.base === base.value), spec().density));
    const s = spec();
    fill(paramsBox, s.density ? field("param-density", "density", h("input", {
      type: "number", step: "0.01", min: "0.01", max: "1", value: "0.5",
      dataset: {param: "density", type: "float"}}), "global density (experts without their own)") : null,
      s.params.map((p) => paramControl(p)));
  };
  let seq = 0, timer = null;
  const replan = () => {
    clearTimeout(timer);
    timer = setTimeout(async () => {
      const mine = ++seq;
      const pctValue = Number(slider.value);
      fill(sliderOut, `${pctValue}% of the full read`);
      slider.setAttribute("aria-valuetext", `${pctValue} per cent of the full read`);
      if (!outName.dataset.touched) outName.value = `${op.value}-${pctValue}`;
      const req = request();
      frontier.href = `#/frontier?r=${encodeState(req)}`;
      sessionStorage.setItem(LAST_REQUEST, encodeState(req));
      if (!req.experts.length) { fill(result, h("p", {}, "Pick at least one expert.")); fill(mapSlot); return; }
      try {
        const p = await post("/v1/plans?tensors=true", {...req, budget: {fraction: pctValue / 100}});
        if (mine !== seq) return;  // a newer plan is on its way
        fill(result, planFacts(p), table("Plan per expert", EXPERT_COLUMNS, p.experts, {id: "plan-experts"}));
        fill(mapSlot, heatmap(p.tensors, req.experts.map((e) => e.model), `Share of each tensor the plan reads at ${pctValue}%`));
        result.dataset.planHash = p.plan_hash;
      } catch (err) {
        if (mine === seq) { fill(result, errorBox(err)); fill(mapSlot); }
      }
    }, 120);
  };
  const start = async (e) => {
    e.preventDefault();
    const body = {...request(), budget: {fraction: Number(slider.value) / 100},
                  output: {name: outName.value.trim()}};
    if (seed.value !== "") body.seed = Number(seed.value);
    try {
      const m = await post("/v1/merges", body);
      fill(started, h("p", {}, "Started ", link(`#/merge/${m.id}`, m.id), "."));
      location.hash = `#/merge/${encodeURIComponent(m.id)}`;
    } catch (err) {
      fill(started, errorBox(err));
    }
  };
  // the smallest budget (grid 0.01) whose plan predicts at most the target: the slider moves there
  const findBudget = async () => {
    try {
      const p = await post("/v1/plans", {...request(), target_deviation: Number(target.value)});
      const s = p.budget_search;
      slider.value = String(Math.round(100 * s.fraction));
      fill(targetOut, h("p", {}, `${pct(s.fraction, 0)} of the full read predicts ${num(s.predicted_deviation)}`,
        s.below === null ? "" : `; ${pct(s.below, 0)} predicts ${s.below_deviation === null ? "no expert byte read" : num(s.below_deviation)}`,
        ` (grid ${pct(s.resolution, 0)}, ${s.plans} plans)`));
      replan();
    } catch (err) {
      fill(targetOut, errorBox(err));
    }
  };
  base.addEventListener("change", () => { drawInputs(); replan(); });
  op.addEventListener("change", () => { drawInputs(); replan(); });
  for (const el of [expertsBox, paramsBox, slider]) el.addEventListener("input", replan);
  for (const el of [expertsBox, paramsBox]) el.addEventListener("change", replan);
  outName.addEventListener("input", () => { outName.dataset.touched = "1"; });

  const form = h("form", {class: "card plan-form", onsubmit: start, "aria-label": "Request"},
    h("div", {class: "fields"}, field("plan-base", "Base", base), field("plan-op", "Operator", op)),
    expertsBox, paramsBox,
    h("div", {class: "field budget"}, h("label", {for: "budget"}, "Budget"), Object.assign(slider, {id: "budget"}), sliderOut),
    h("div", {class: "fields"}, field("plan-target", "Target deviation", target,
      "the smallest budget whose predicted deviation is at most this (0 to 1; additive operators)"),
      h("div", {class: "toolbar"}, h("button", {type: "button", id: "find-budget", onclick: findBudget}, "Find the budget"))),
    targetOut,
    h("div", {class: "fields"}, field("plan-output", "Output name", outName), field("plan-seed", "Seed", seed)),
    h("div", {class: "toolbar"}, h("button", {type: "submit", id: "start-merge"}, "Start the merge at this budget"), frontier),
    started);
  main.append(h("div", {class: "plan-layout"}, form,
    h("section", {class: "plan-out", "aria-label": "Plan"}, h("h2", {}, "The plan"), result,
      h("h2", {}, "What the plan reads"), mapSlot)));
  drawInputs();
  replan();
  return {stop: () => clearTimeout(timer)};
}
