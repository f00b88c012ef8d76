// The console's one HTTP client: JSON over /v1 with the bearer token kept in sessionStorage.

const KEY = "mergepipe.token";

export class ApiError extends Error {
  constructor(status, message, field) {
    super(message);
    this.status = status;
    this.field = field;
  }
}

export function token() {
  return sessionStorage.getItem(KEY) || "";
}

export function setToken(value) {
  if (value) sessionStorage.setItem(KEY, value);
  else sessionStorage.removeItem(KEY);
  document.dispatchEvent(new CustomEvent("mergepipe:token"));
}

/** call("GET", "/v1/models") -> the parsed body; an ApiError with the API's message otherwise.
 *  Every request carries the token when one was entered (reads too: a server may want it). */
export async function call(method, path, body) {
  const headers = {"Accept": "application/json"};
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const t = token();
  if (t) headers["Authorization"] = `Bearer ${t}`;
  let r;
  try {
    r = await fetch(path, {method, headers, body: body === undefined ? undefined : JSON.stringify(body),
                           cache: "no-store"});
  } catch (e) {
    throw new ApiError(0, `the server did not answer (${e.message})`);
  }
  const text = await r.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = null; }
  if (!r.ok) {
    const err = data && data.error ? data.error : {message: text.slice(0, 300) || r.statusText};
    if (r.status === 401) document.dispatchEvent(new CustomEvent("mergepipe:unauthorized"));
    throw new ApiError(r.status, err.message, err.field);
  }
  return data;
}

export const get = (path) => call("GET", path);
export const post = (path, body) => call("POST", path, body);
