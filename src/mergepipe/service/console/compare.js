// Compare two models on a text: teacher-forced KL(A || B) per token and both perplexities
// (POST /v1/compare; the models run on the server's CPU while the page waits).

import {get, post} from "./api.js";
import {announce, errorBox, field, fill, h, int, num, seconds} from "./ui.js";

function modelSelect(models, chosen) {
  return h("select", {}, models.map((m) => h("option", {value: m.name, selected: m.name === chosen}, m.name)));
}

export async function renderCompare(main, _arg, query) {
  fill(main, h("h1", {}, "Compare two models"),
       h("p", {}, "Both models read your text token by token (teacher forcing). KL(A ‖ B) is the mean, over the ",
         "predicted tokens, of how far B's next-token distribution is from A's, in nats; 0 means B predicts as A does. ",
         "The usual check: the full merge as A, a budgeted merge as B."));
  let models;
  try {
    ({models} = await get("/v1/models"));
  } catch (err) {
    main.append(errorBox(err));
    return null;
  }
  const ready = models.filter((m) => m.status === "ready" && m.kind === "full");
  if (ready.length === 0) {
    main.append(h("p", {}, "No ready full model to run yet."));
    return null;
  }
  const a = modelSelect(ready, query.get("a") || ready[0].name);
  const b = modelSelect(ready, query.get("b") || ready[ready.length - 1].name);
  const text = h("textarea", {rows: 8, spellcheck: false});
  const tokens = h("input", {type: "number", min: "2", max: "8192", step: "1", value: "2048"});
  const out = h("div", {id: "compare-result", "aria-live": "polite"});
  const run = async (e) => {
    e.preventDefault();
    fill(out, h("p", {}, "Running both models on the server…"));
    try {
      const r = await post("/v1/compare", {model_a: a.value, model_b: b.value, text: text.value,
                                           tokens: Number(tokens.value)});
      fill(out, h("dl", {class: "facts", id: "compare-facts"},
        h("dt", {}, "KL(A ‖ B)"), h("dd", {id: "compare-kl"}, `${num(r.kl)} nats per token`),
        h("dt", {}, `Perplexity A (${r.model_a})`), h("dd", {id: "compare-ppl-a"}, num(r.perplexity_a)),
        h("dt", {}, `Perplexity B (${r.model_b})`), h("dd", {id: "compare-ppl-b"}, num(r.perplexity_b)),
        h("dt", {}, "Tokens"), h("dd", {id: "compare-tokens"},
          `${int(r.tokens)} (${int(r.positions)} predictions in ${r.windows} window(s) of at most ${int(r.context)}; tokenizer of ${r.tokenizer})`),
        h("dt", {}, "Time"), h("dd", {}, seconds(r.seconds))));
      announce(`KL ${num(r.kl)} nats per token`);
    } catch (err) {
      fill(out, errorBox(err));
    }
  };
  main.append(h("form", {class: "card", onsubmit: run, "aria-label": "Comparison"},
    h("div", {class: "fields"}, field("compare-a", "Model A", a), field("compare-b", "Model B", b),
      field("compare-tokens-max", "Tokens", tokens, "read at most this many tokens of the text (2 to 8192)")),
    field("compare-text", "Text", text, "your own text, in the models' language"),
    h("div", {class: "toolbar"}, h("button", {type: "submit", id: "compare-run"}, "Compare"))),
    out);
  return null;
}
