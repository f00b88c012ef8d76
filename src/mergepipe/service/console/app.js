// The console's router: #/page/arg?query -> a page's render(main, args); the token form.

import {setToken, token} from "./api.js";
import {renderCompare} from "./compare.js";
import {renderFrontier} from "./frontier.js";
import {renderLineage} from "./lineage.js";
import {renderMerge} from "./merge.js";
import {renderMerges} from "./merges.js";
import {renderModels} from "./models.js";
import {renderPlan} from "./plan.js";
import {renderSql} from "./sql.js";
import {announce, fill, h} from "./ui.js";

const PAGES = {
  models: renderModels,
  merges: renderMerges,
  merge: renderMerge,
  lineage: renderLineage,
  plan: renderPlan,
  frontier: renderFrontier,
  sql: renderSql,
  compare: renderCompare,
};

let current = null;  // the page shown: {stop()} to end its polling

function parseHash() {
  const raw = location.hash.replace(/^#\/?/, "") || "models";
  const [path, query = ""] = raw.split("?");
  const [page, ...rest] = path.split("/");
  return {page, arg: rest.map(decodeURIComponent).join("/"), query: new URLSearchParams(query)};
}

async function route() {
  const {page, arg, query} = parseHash();
  const main = document.getElementById("main");
  if (current && current.stop) current.stop();
  current = null;
  for (const a of document.querySelectorAll("nav a")) {
    const here = a.getAttribute("href") === `#/${page === "merge" ? "merges" : page}`;
    if (here) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  const render = PAGES[page];
  if (!render) {
    fill(main, h("h1", {}, "Not found"), h("p", {}, `There is no page "${page}".`));
    return;
  }
  fill(main);
  current = (await render(main, arg, query)) || null;
  const title = main.querySelector("h1");
  document.title = `${title ? title.textContent : page} · MergePipe`;
  if (title) announce(title.textContent);
  main.focus({preventScroll: true});
}

function tokenForm() {
  const form = document.getElementById("token-form");
  const input = document.getElementById("token");
  const state = document.getElementById("token-state");
  const show = (msg) => fill(state, msg || (token() ? "token set" : "no token"));
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    setToken(input.value.trim());
    input.value = "";
    show();
    // reload a page that failed (e.g. a read refused without the token); keep one being edited
    if (document.querySelector("main [role=alert]") && !document.querySelector("main form")) route();
  });
  document.getElementById("token-clear").addEventListener("click", () => { setToken(""); show(); });
  document.addEventListener("mergepipe:unauthorized", () => {
    show("this server needs a token: enter it here");
    state.classList.add("error");
    input.focus();
  });
  document.addEventListener("mergepipe:token", () => state.classList.remove("error"));
  show();
}

window.addEventListener("hashchange", route);
tokenForm();
route();
