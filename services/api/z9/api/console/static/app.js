// The z9 console: one page, routed by its path under /console, calling the /v1 API with the
// session's cookie (HttpOnly: this script never sees the token) and the session's CSRF token on
// every mutation. The resource kinds, their lists' filters, forms and actions come from the
// API's OpenAPI document: a kind the API registers appears here without console code.
import { h } from "./dom.js";
import { label, nonNull, objectFields, resolve, showErrors, validate } from "./schema.js";
import { STATUS_CLASS, settled } from "./status.js";

const BASE = "/console";
const LONG_POLL_S = 25; // GET /v1/jobs/{id}?wait_s=: answers on each change
const MIN_GAP_MS = 5000;
const POLL_MS = 5000; // a resource's page (and a list) reads its jobs again this often while visible: jobs started elsewhere show // never a request for the same job sooner than this after an error or an unchanged answer
const OWN_PAGES = new Set(["jobs", "tokens", "quota", "operator", "sign-in", "static", "session"]);

const state = { session: null, doc: null, kinds: [], stop: [] };
// replaceChildren without the empty parts (null, undefined, false: a section that does not apply)
const put = (el, ...c) => el.replaceChildren(...c.flat().filter((x) => x !== null && x !== undefined && x !== false));
const main = () => document.getElementById("main");

// ------------------------------------------------------------------ API

class ApiError extends Error {
  constructor(status, body, requestId) {
    const e = (body && body.error) || {};
    super(e.message || `HTTP ${status}`);
    this.status = status;
    this.code = e.code;
    this.details = e.details || [];
    // the id the API logged the request under (its X-Request-Id answer): what a user quotes
    this.requestId = e.request_id || requestId || null;
  }
}

async function api(method, path, body, { signal, idempotencyKey } = {}) {
  const headers = { Accept: "application/json" };
  if (idempotencyKey) headers["Idempotency-Key"] = idempotencyKey;
  if (method !== "GET" && state.session) headers["X-CSRF-Token"] = state.session.csrf_token;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const r = await fetch(path.startsWith("/") ? path : `/v1/${path}`, {
    method, headers, body: body === undefined ? undefined : JSON.stringify(body), credentials: "same-origin", signal,
  });
  const text = await r.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = null; }
  if (r.status === 401 && !path.startsWith("/console/")) { state.session = null; go("/sign-in"); }
  if (!r.ok) throw new ApiError(r.status, data, r.headers.get("X-Request-Id"));
  return data;
}

// A fresh Idempotency-Key (128 random bits, hex): one per click, so that the API answers a resent
// request (a retry of the same click) as it answered the first, never making a second job.
function newKey() {
  const b = new Uint8Array(16);
  crypto.getRandomValues(b);
  return [...b].map((x) => x.toString(16).padStart(2, "0")).join("");
}

// Run a click's request with its button disabled until the answer is in: a double click (or an
// impatient second one) sends nothing more. The button is left disabled if it was disabled.
async function inFlight(button, send) {
  if (!button || button.disabled) return undefined;
  button.disabled = true;
  button.setAttribute("aria-busy", "true");
  try { return await send(newKey()); } finally { button.disabled = false; button.removeAttribute("aria-busy"); }
}

const canWrite = () => Boolean(state.session && state.session.scopes.includes("write"));
const isOperator = () => Boolean(state.session && state.session.scopes.includes("operator"));

function announce(text) {
  const el = document.getElementById("announce");
  el.textContent = "";
  setTimeout(() => { el.textContent = text; }, 50);
}

// ------------------------------------------------------------------ kinds from the OpenAPI document

function schemaOf(op, status) {
  const c = op && op.responses && op.responses[status] && op.responses[status].content;
  return c && c["application/json"] ? c["application/json"].schema : null;
}

function deriveKinds(doc) {
  const kinds = [];
  for (const [path, ops] of Object.entries(doc.paths)) {
    const m = path.match(/^\/([a-z][a-z-]*)$/);
    if (!m || OWN_PAGES.has(m[1]) || !ops.get || !ops.post) continue;
    const itemPath = `${path}/{id}`;
    const item = doc.paths[itemPath];
    if (!item || !item.get) continue;
    const listSchema = resolve(doc, schemaOf(ops.get, "200"));
    const listKey = Object.entries(listSchema.properties || {}).find(([, v]) => resolve(doc, v).type === "array");
    const oneSchema = resolve(doc, schemaOf(item.get, "200"));
    const oneKey = Object.keys(oneSchema.properties || {})[0];
    if (!listKey || !oneKey) continue;
    const reqSchema = ops.post.requestBody && ops.post.requestBody.content["application/json"].schema;
    const actions = [];
    const subs = [];
    for (const [p, o] of Object.entries(doc.paths)) {
      const a = p.match(new RegExp(`^${path}/\\{id\\}/actions/([a-z-]+)$`));
      if (a && o.post) actions.push({ name: a[1], op: o.post, path: p });
      const s = p.match(new RegExp(`^${path}/\\{id\\}/([a-z-]+)$`));
      if (s && o.get) subs.push({ name: s[1], op: o.get, path: p });
    }
    kinds.push({
      plural: m[1], listKey: listKey[0], oneKey, title: m[1].replace(/-/g, " ").replace(/^./, (c) => c.toUpperCase()),
      listOp: ops.get, createOp: ops.post, createSchema: reqSchema, itemSchema: resolve(doc, oneSchema.properties[oneKey]),
      patch: item.patch, del: item.delete, actions, subs,
    });
  }
  return kinds;
}

// ------------------------------------------------------------------ helpers


function badge(status, text) {
  return h("span", { class: `badge ${STATUS_CLASS[status] ?? ""}` }, text || status || "—");
}

function when(ts) {
  if (!ts) return "—";
  const d = new Date(ts);
  return h("time", { datetime: ts, title: ts }, d.toLocaleString());
}

function ago(ts) {
  if (!ts) return "";
  const s = Math.max(0, Math.round((Date.now() - new Date(ts).getTime()) / 1000));
  if (s < 90) return `${s}s`;
  if (s < 5400) return `${Math.round(s / 60)} min`;
  return `${Math.round(s / 3600)} h`;
}

function duration(a, b) {
  if (!a) return "";
  const ms = (b ? new Date(b) : new Date()) - new Date(a);
  return ms < 1000 ? `${ms} ms` : `${(ms / 1000).toFixed(1)} s`;
}

function table(caption, headers, rows, empty = "Nothing here yet.") {
  if (!rows.length) return h("p", { class: "muted" }, empty);
  return h("div", { class: "table-wrap", tabindex: "0", role: "region", "aria-label": caption },
    h("table", {}, h("caption", {}, caption),
      h("thead", {}, h("tr", {}, ...headers.map((x) => h("th", { scope: "col" }, x)))),
      h("tbody", {}, ...rows.map((r) => h("tr", {}, ...r.map((c) => h("td", {}, c)))))));
}

function value(v) {
  if (v === null || v === undefined || v === "") return h("span", { class: "muted" }, "—");
  if (typeof v === "boolean") return v ? "yes" : "no";
  if (typeof v === "string" && /^\d{4}-\d\d-\d\dT/.test(v)) return when(v);
  if (typeof v === "string" && /^[a-z0-9]+_[0-9a-z]{26}$/.test(v)) return idLink(v);
  if (typeof v !== "object") return String(v);
  if (Array.isArray(v)) {
    if (!v.length) return h("span", { class: "muted" }, "none");
    if (v.every((x) => typeof x !== "object" || x === null)) return v.join(", ");
    return h("ul", {}, ...v.map((x) => h("li", {}, value(x))));
  }
  const entries = Object.entries(v);
  if (!entries.length) return h("span", { class: "muted" }, "none");
  return h("dl", { class: "kv" }, ...entries.flatMap(([k, x]) => [h("dt", {}, k.replace(/_/g, " ")), h("dd", {}, value(x))]));
}

// an id's prefix → its kind's page, from each kind's id pattern in the document (^srv_…)
function prefixKinds() {
  const out = {};
  for (const k of state.kinds) {
    const idp = k.itemSchema.properties && k.itemSchema.properties.id && resolve(state.doc, k.itemSchema.properties.id).pattern;
    const m = idp && idp.match(/^\^([a-z0-9]+)_/);
    if (m) out[m[1]] = k.plural;
  }
  return out;
}

function idLink(id) {
  const p = id.split("_")[0];
  const PREFIX_KIND = prefixKinds();
  if (p === "job") return link(`/jobs/${id}`, h("code", {}, id));
  if (PREFIX_KIND[p] && state.kinds.some((k) => k.plural === PREFIX_KIND[p])) return link(`/${PREFIX_KIND[p]}/${id}`, h("code", {}, id));
  return h("code", {}, id);
}

function labelsText(l) {
  const e = Object.entries(l || {});
  return e.length ? e.map(([k, v]) => `${k}=${v}`).join(", ") : "";
}

function link(path, ...children) {
  return h("a", { href: BASE + path, "data-nav": "" }, ...children);
}

function errorNotice(e) {
  const box = h("div", { class: "notice bad", role: "alert" },
    h("strong", {}, e.status === 403 ? "Refused: " : e.status === 404 ? "Not found: " : "Error: "), e.message,
    e.code ? h("span", { class: "muted" }, ` (${e.status} ${e.code})`) : "",
    e.requestId ? h("p", { class: "request-id" }, "Request id (quote it when asking for help): ", h("code", {}, e.requestId)) : null);
  return box;
}

function page(title, ...content) {
  document.title = `${title} · z9 console`;
  const m = main();
  put(m, h("h1", {}, title), ...content);
  return m;
}

// ------------------------------------------------------------------ router

function go(path, replace = false) {
  const url = BASE + path;
  if (replace) history.replaceState(null, "", url); else history.pushState(null, "", url);
  route();
}

document.addEventListener("click", (ev) => {
  const a = ev.target.closest && ev.target.closest("a[data-nav]");
  if (!a || ev.ctrlKey || ev.metaKey || ev.shiftKey || ev.button !== 0) return;
  ev.preventDefault();
  go(a.getAttribute("href").slice(BASE.length));
});
window.addEventListener("popstate", () => route());

function stopLive() {
  for (const f of state.stop) f();
  state.stop = [];
}

async function route() {
  stopLive();
  const path = location.pathname.slice(BASE.length).replace(/\/+$/, "") || "/";
  const parts = path.split("/").filter(Boolean);
  renderNav(parts[0] || "");
  try {
    if (!state.session && parts[0] !== "sign-in") {
      try { state.session = await api("GET", "/console/session"); } catch { state.session = null; }
      if (state.session && !state.session.signed_in) state.session = null;
      if (!state.session) return go("/sign-in", true);
      renderNav(parts[0] || "");
    }
    if (parts[0] === "sign-in") return await signInPage();
    if (!state.doc) {
      state.doc = await api("GET", "openapi.json");
      state.kinds = deriveKinds(state.doc);
      renderNav(parts[0] || "");
    }
    if (!parts.length) return await overviewPage();
    if (parts[0] === "jobs") return parts[1] ? await jobPage(parts[1]) : await jobsPage();
    if (parts[0] === "tokens") return await tokensPage();
    if (parts[0] === "quota") return await quotaPage();
    if (parts[0] === "operator") return parts[1] === "jobs" && parts[2] ? await operatorJobPage(parts[2]) : await operatorPage();
    const kind = state.kinds.find((k) => k.plural === parts[0]);
    if (!kind) return page("Not found", h("p", {}, "No such page."), link("/", "Back to the overview"));
    if (!parts[1]) return await listPage(kind);
    if (parts[1] === "new") return await createPage(kind);
    return await detailPage(kind, parts[1]);
  } catch (e) {
    if (e instanceof ApiError) page(e.status === 404 ? "Not found" : "Something went wrong", errorNotice(e));
    else { page("Something went wrong", h("p", {}, String(e))); console.error(e); }
  } finally {
    main().focus({ preventScroll: true });
  }
}

function renderNav(current) {
  const nav = document.getElementById("nav");
  const who = document.getElementById("who");
  if (!state.session) { put(nav, ); put(who, ); return; }
  const items = [["", "Overview"], ...state.kinds.map((k) => [k.plural, k.title]), ["jobs", "Jobs"], ["tokens", "Tokens"], ["quota", "Quota"]];
  if (isOperator()) items.push(["operator", "Operator"]);
  put(nav, h("ul", {}, ...items.map(([p, t]) =>
    h("li", {}, h("a", { href: `${BASE}/${p}`, "data-nav": "", "aria-current": p === current ? "page" : null }, t)))));
  const out = h("button", { type: "button", onclick: signOut }, "Sign out");
  put(who, h("span", { title: state.session.tenant }, `Tenant ${state.session.tenant_name || state.session.tenant}`),
    badge(canWrite() ? "" : "warn", state.session.scopes.join(" + ")), out);
}

async function signOut() {
  try { await api("DELETE", "/console/session"); } catch { /* signed out anyway */ }
  state.session = null;
  go("/sign-in");
  announce("Signed out");
}

// ------------------------------------------------------------------ sign in

async function signInPage() {
  renderNav("");
  const input = h("input", { id: "token", name: "token", type: "password", autocomplete: "off", required: "", "aria-describedby": "token-hint" });
  const status = h("div", { role: "status" });
  const form = h("form", { class: "form" },
    h("div", { class: "field" }, h("label", { for: "token" }, "API token"),
      h("p", { class: "hint", id: "token-hint" }, "z9 dev prints one (also in .z9/dev-token); z9 token --tenant NAME makes one. Signing in makes a session: this site's HttpOnly cookie holds a random session id, never the token."),
      input),
    h("div", {}, h("button", { class: "primary", type: "submit" }, "Sign in")), status);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      state.session = await api("POST", "/console/session", { token: input.value });
      state.doc = null;
      go("/");
      announce("Signed in");
    } catch (e) {
      put(status, errorNotice(e));
      input.setAttribute("aria-invalid", "true");
      input.focus();
    }
  });
  page("Sign in to z9", form);
  input.focus();
}

// ------------------------------------------------------------------ overview

async function overviewPage() {
  const cards = h("div", { class: "grid" });
  page("Overview", cards);
  const [quota, ...lists] = await Promise.all([api("GET", "quota").catch(() => null),
    ...state.kinds.map((k) => api("GET", `${k.plural}?limit=500`).catch(() => null))]);
  state.kinds.forEach((k, i) => {
    const items = lists[i] ? lists[i][k.listKey].filter((x) => x.status !== "deleted") : [];
    const by = {};
    for (const x of items) by[x.status] = (by[x.status] || 0) + 1;
    cards.append(h("section", { class: "card", "aria-labelledby": `card-${k.plural}` },
      h("h2", { id: `card-${k.plural}` }, link(`/${k.plural}`, k.title)),
      h("p", {}, `${items.length} live`), h("p", {}, ...Object.entries(by).map(([s, n]) => [badge(s, `${n} ${s}`), " "])),
      canWrite() ? link(`/${k.plural}/new`, `Create ${k.oneKey.replace(/_/g, " ")}`) : null));
  });
  if (quota) main().append(h("h2", {}, "Quota"), quotaTable(quota));
}

function quotaTable(q) {
  return table("Quotas and use", ["what", "used", "limit"],
    Object.entries(q.quotas).map(([k, v]) => [k.replace(/_/g, " "), String(v.used), v.limit === null ? "no limit" : String(v.limit)]));
}

async function quotaPage() {
  const q = await api("GET", "quota");
  page("Quota", h("p", {}, "Your tenant's limits (set by the operator) and what is used now."), quotaTable(q));
}

// ------------------------------------------------------------------ lists

function queryParams(op) {
  return (op.parameters || []).filter((p) => p.in === "query" && !["after", "limit"].includes(p.name));
}

async function listPage(kind) {
  const params = new URLSearchParams(location.search);
  const filters = h("form", { class: "filters", role: "search", "aria-label": `Filter ${kind.title.toLowerCase()}` });
  for (const p of queryParams(kind.listOp)) {
    const s = nonNull(state.doc, p.schema);
    const id = `q-${p.name}`;
    let c;
    if (s.enum) c = h("select", { id, name: p.name }, h("option", { value: "" }, "any"), ...s.enum.map((v) => h("option", { value: v }, v)));
    else if (s.type === "boolean") c = h("select", { id, name: p.name }, h("option", { value: "" }, "default"), h("option", { value: "true" }, "yes"), h("option", { value: "false" }, "no"));
    else c = h("input", { id, name: p.name, type: "text" });
    c.value = params.get(p.name) || "";
    filters.append(h("div", { class: "field" }, h("label", { for: id }, label(p.name)), c));
  }
  filters.append(h("div", {}, h("button", { type: "submit" }, "Filter")));
  filters.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const q = new URLSearchParams();
    for (const [k, v] of new FormData(filters)) if (v) q.set(k, v);
    go(`/${kind.plural}${q.toString() ? "?" + q : ""}`);
  });
  const bar = h("div", { class: "bar" }, canWrite() ? h("a", { class: "button primary", href: `${BASE}/${kind.plural}/new`, "data-nav": "" }, `Create ${kind.oneKey.replace(/_/g, " ")}`) : null);
  const box = h("div", {}, h("p", {}, "Loading…"));
  page(kind.title, bar, filters, box);
  const q = new URLSearchParams();
  for (const [k, v] of params) q.set(k, v);
  q.set("limit", "200");
  const here = location.href;
  const load = async (first) => {
    let data;
    try { data = await api("GET", `${kind.plural}?${q}`); } catch (e) { if (first) put(box, errorNotice(e)); return; }
    const items = data[kind.listKey];
    const [busy, tied] = await Promise.all([busyIds(), tiedTo(kind)]);
    if (location.href !== here) return;
    // busy null: the jobs could not be read — no row is claimed done
    const waiting = busy && new Set([...busy].map((rid) => tied[rid] || rid));
    const extra = ["health", "type", "ip", "version"].filter((f) => kind.itemSchema.properties && kind.itemSchema.properties[f]);
    put(box, table(`${kind.title}: ${items.length}`, ["name", "status", ...extra, "region", "labels", "created"],
      items.map((x) => [link(`/${kind.plural}/${x.id}`, x.name || x.id), statusCell(x, waiting ? waiting.has(x.id) : null), ...extra.map((f) => f === "health" ? badge(x[f]) : value(x[f])),
        x.region || "", labelsText(x.labels), when(x.created_at)]), `No ${kind.title.toLowerCase()} yet.`));
  };
  await load(true);
  // read again while shown: a job started elsewhere (the CLI, the API) turns its row "not ready"
  const timer = setInterval(() => {
    if (location.href !== here) clearInterval(timer);
    else if (document.visibilityState === "visible") load(false).catch(() => {});
  }, 2 * POLL_MS);
  state.stop.push(() => clearInterval(timer));
}

// The ids of the tenant's resources with a job still on its way (pending, running, retry); null
// when the jobs could not be read (unknown is not "none").
async function busyIds() {
  let failed = false;
  const lists = await Promise.all(["pending", "running", "retry"].map((st) =>
    api("GET", `jobs?status=${st}&limit=500&include_observe=false`).then((r) => r.jobs, () => { failed = true; return []; })));
  return failed ? null : new Set(lists.flat().map((j) => j.resource && j.resource.id).filter(Boolean));
}

// {id of a resource tied to one of `kind` (a server's address, volume): that one's id}, from the
// other kinds' lists that take ?<kind>_id=
async function tiedTo(kind) {
  const param = `${kind.oneKey}_id`;
  const out = {};
  await Promise.all(state.kinds.filter((k) => k !== kind && queryParams(k.listOp).some((p) => p.name === param)).map((k) =>
    api("GET", `${k.plural}?limit=500`).then((r) => { for (const x of r[k.listKey]) if (x[param]) out[x.id] = x[param]; }, () => {})));
  return out;
}

// A status in a list: one that reads as done ("running") is not shown as done while a job of the
// resource, or of one tied to it, is still on its way (what --wait would still be waiting for).
function statusCell(x, waiting) {
  if (waiting === null && STATUS_CLASS[x.status] === "ok") {
    return h("span", { class: "readiness", "data-ready": "unknown", title: "its jobs could not be read" }, h("span", { class: "badge" }, x.status), " readiness unknown");
  }
  if (!waiting || STATUS_CLASS[x.status] !== "ok") return badge(x.status);
  return h("span", { class: "readiness", "data-ready": "false" }, h("span", { class: "badge info" }, x.status), " not ready");
}

// ------------------------------------------------------------------ create and action forms

// The tenant's resources of an id prefix (srv → servers), for the forms' pickers: [{id, label}].
function refs(prefix) {
  const plural = prefixKinds()[prefix];
  if (!plural) return Promise.resolve([]);
  const kind = state.kinds.find((k) => k.plural === plural);
  return api("GET", `${plural}?limit=500`).then((r) => r[kind.listKey]
    .filter((x) => !["deleted", "destroying"].includes(x.status))
    .map((x) => ({ id: x.id, label: `${x.name || x.id} (${x.id}${x.ip ? ", " + x.ip : ""}${x.server_id ? ", on " + x.server_id : ""})` })));
}

// A form generated from a request schema (schema.js), with an "advanced" switch to the raw JSON
// body (the same validation before sending).
function schemaForm(schema, { submit, onSubmit, values, skip, fillFromExample = false }) {
  const fields = objectFields(state.doc, schema, { values, skip, fillFromExample, refs });
  const summary = h("div", { class: "notice bad", role: "alert", tabindex: "-1", hidden: "" });
  const status = h("div", { role: "status" });
  const rawId = `raw-${Math.random().toString(36).slice(2)}`;
  const raw = h("textarea", { id: rawId, name: "_json", rows: "10", class: "mono", spellcheck: "false" });
  const rawBox = h("div", { class: "field", "data-field": "", hidden: "" },
    h("label", { for: rawId }, "Request body (JSON)"), raw, h("p", { class: "error", hidden: "" }));
  const toggle = h("input", { type: "checkbox", id: `${rawId}-on`, "data-advanced": "" });
  toggle.addEventListener("change", () => {
    if (toggle.checked) raw.value = JSON.stringify(fields.read().value, null, 2);
    rawBox.hidden = !toggle.checked;
    fields.element.hidden = toggle.checked;
  });
  const form = h("form", { class: "form", novalidate: "" }, summary, fields.element, rawBox,
    h("div", { class: "advanced" }, toggle, h("label", { for: `${rawId}-on` }, " Advanced: edit the request as JSON")),
    h("div", {}, h("button", { class: "primary", type: "submit" }, submit)), status);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    let r = fields.read();
    if (toggle.checked) {
      try { r = { value: raw.value.trim() ? JSON.parse(raw.value) : {}, errors: [] }; } catch { r = { value: undefined, errors: [{ path: "", message: "not valid JSON" }] }; }
    }
    const errors = [...r.errors, ...(r.value === undefined ? [] : validate(state.doc, schema, r.value).filter((e) => !r.errors.some((x) => x.path === e.path)))];
    showErrors(form, errors, summary);
    if (errors.length) return;
    const btn = form.querySelector("button[type=submit]");
    btn.disabled = true;
    status.textContent = "Sending…";
    try {
      await onSubmit(r.value);
      status.textContent = "";
    } catch (e) {
      put(status, );
      if (e instanceof ApiError && e.details.some((d) => d.field)) {
        showErrors(form, e.details.filter((d) => d.field).map((d) => ({ path: String(d.field), message: d.message || e.message })), summary);
      } else put(status, e instanceof ApiError ? errorNotice(e) : String(e));
    } finally {
      btn.disabled = false;
    }
  });
  return form;
}

async function createPage(kind) {
  if (!canWrite()) return page(`Create ${kind.oneKey.replace(/_/g, " ")}`, h("p", {}, "This token is read-only."));
  // what the installation offers (GET /v1/regions, /v1/images), read before the form is shown: its
  // region and image fields are selects of those from the start (an image list follows the region
  // chosen), never a text field that turns into a select under the user's hands
  const title = `Create ${kind.oneKey.replace(/_/g, " ")}`;
  page(title, h("p", { role: "status" }, "Loading the regions and images offered…"));
  const [regions, images] = await Promise.all([api("GET", "regions").catch(() => null), api("GET", "images").catch(() => null)]);
  const hints = h("div", {});
  const form = schemaForm(kind.createSchema, {
    submit: "Create", fillFromExample: true,
    onSubmit: async (body) => {
      const r = await api("POST", kind.plural, body);
      announce(`${kind.oneKey} accepted; job ${r.job.id} ${r.job.status}`);
      go(`/${kind.plural}/${r[kind.oneKey].id}`);
    },
  });
  page(title, h("p", {}, "Every field is checked against the API's own constraints before it is sent."), hints, form);
  if (regions && regions.regions.length) {
    const region = choose(form, "region", regions.regions.map((r) => r.name));
    const imageInput = form.querySelector("input[type=text][name=image]");
    if (imageInput) {
      const offered = (name) => {
        const r = regions.regions.find((x) => x.name === name);
        const byRegion = images ? images.images.filter((i) => !name || i.regions.includes(name)).map((i) => i.name) : [];
        return r && r.images.length ? r.images : byRegion;
      };
      const image = choose(form, "image", offered(region ? region.value : ""));
      if (region && image) {
        region.addEventListener("change", () => {
          const keep = image.value;
          const opts = offered(region.value);
          image.replaceChildren(...selectOptions(opts, !image.hasAttribute("aria-required")));
          if (opts.includes(keep)) image.value = keep;
          image.dispatchEvent(new Event("change"));
        });
      }
      // a server's disk: at least its image's (GET /v1/images disk_gib)
      const disk = form.querySelector("input[name=disk_gib]");
      if (image && disk && images) {
        const fit = () => {
          const i = images.images.find((x) => x.name === image.value);
          if (i && i.disk_gib && Number(disk.value || 0) < i.disk_gib) disk.value = String(Math.ceil(i.disk_gib));
        };
        image.addEventListener("change", fit);
        fit();
      }
    }
  }
}

function selectOptions(options, optional) {
  return [optional ? h("option", { value: "" }, "—") : null, ...options.map((o) => h("option", { value: o }, o))].filter(Boolean);
}

// a text field replaced by a select of what the API offers (same id, name and description)
function choose(form, name, options) {
  const input = form.querySelector(`input[type=text][name="${CSS.escape(name)}"]`);
  if (!input || !options.length) return null;
  const optional = !input.hasAttribute("aria-required");
  const select = h("select", {}, ...selectOptions(options, optional));
  for (const a of ["id", "name", "aria-describedby", "aria-required"]) if (input.hasAttribute(a)) select.setAttribute(a, input.getAttribute(a));
  if (input.value && options.includes(input.value)) select.value = input.value;
  else if (!optional) select.value = options[0];
  // the form reads the field through its input: the input's value is now the select's
  Object.defineProperty(input, "value", { get: () => select.value, set: (v) => { select.value = v; }, configurable: true });
  input.replaceWith(select);
  return select;
}

// ------------------------------------------------------------------ detail

// Why an action makes no sense on the resource as it is now (null: it does), from the API's own
// refusals (resources/z9/resources/server/api_actions.py): a power action or resize on a server
// still being created is 409 server_creating; start on a running VM and a stop on a stopped one
// would only run a job that plans nothing. Reboot starts a stopped server, so it stays offered.
const POWER_ACTIONS = new Set(["start", "shutdown", "poweroff", "reboot", "resize"]);
function unavailable(kind, action, item) {
  if (kind.plural !== "servers" || !POWER_ACTIONS.has(action)) return null;
  if (item.status === "creating") return "the server is still being created";
  const power = item.observed && item.observed.power_state;
  if (action === "start" && item.status === "running" && power === "running") return "it is running";
  if (["shutdown", "poweroff"].includes(action) && item.status === "stopped" && power === "stopped") return "it is stopped";
  return null;
}

// an action that changes nothing: it answers 200 with what it read (no 202, no job)
function readsOnly(op) {
  return Boolean(op.responses && op.responses["200"] && !op.responses["202"]);
}

// what a read-only action answered: a plan as its drift and steps (each step saying whether it
// interrupts the guest), any other answer as its fields
function answerView(a, r) {
  const heading = h("h2", { id: `${a.name}-h` }, a.name.replace(/-/g, " ").replace(/^./, (c) => c.toUpperCase()));
  if (!r || typeof r.in_sync !== "boolean") return h("section", { class: "panel", "aria-labelledby": `${a.name}-h` }, heading, value(r));
  const blocked = (r.blocked_by || []).map((j) => h("div", { class: "notice warn" }, "Job ", idLink(j.id),
    ` (${j.kind}, ${j.status}) comes first: this plan is of the world as it is now.`));
  if (r.waiting) blocked.push(h("div", { class: "notice warn" }, `The job would first wait: ${r.waiting}`));
  if (r.in_sync) {
    return h("section", { class: "panel plan", "aria-labelledby": `${a.name}-h`, "data-in-sync": "true" }, heading, ...blocked,
      h("p", {}, badge("healthy", "in sync"), ` ${r.job_kind || "Its job"} would change nothing.`));
  }
  return h("section", { class: "panel plan", "aria-labelledby": `${a.name}-h`, "data-in-sync": "false" }, heading, ...blocked,
    h("p", {}, badge("degraded", "drift"), ` ${r.job_kind} would run ${r.steps.length} step${r.steps.length === 1 ? "" : "s"}.`),
    table("Drift", ["What", "Wanted", "Found"], r.drift.map((d) => [h("code", {}, d.path), value(d.want), value(d.have)])),
    table("Steps", ["#", "Step", "Member", "Guest", "Why"], r.steps.map((st, i) => [String(i + 1), st.name, st.member || "—",
      st.disruptive ? badge("failed", "disruptive") : "not interrupted", st.why])));
}

async function detailPage(kind, id) {
  const data = await api("GET", `${kind.plural}/${encodeURIComponent(id)}`);
  let item = data[kind.oneKey];
  const head = h("div", {});
  const body = h("div", {});
  const actionsBox = h("div", {});
  const readBox = h("div", { "aria-live": "polite" }); // what a read-only action (the plan) answered: kept across renders
  const jobBox = h("section", { "aria-labelledby": "job-h" });
  const subsBox = h("div", {});
  page(item.name || item.id, head, actionsBox, readBox, jobBox, body, subsBox);
  // Ready as the client's --wait means it: no job of this resource, nor of a resource tied to it
  // (a server's address: its AddressAssign runs after the ServerCreate), still to finish, and a
  // settled status. null until the jobs are read: nothing is claimed before.
  let liveJobs = null;
  let jobsKnown = false; // every list of jobs read (a failed read is no "no jobs")
  const readiness = () => {
    if (liveJobs === null || item.status === "deleted") return null;
    if (liveJobs.length) {
      return [" · ", h("span", { class: "readiness", "data-ready": "false" }, badge("pending", "not ready"), " waiting for ",
        ...liveJobs.flatMap((j, i) => [i ? ", " : "", link(`/jobs/${j.id}`, j.kind), ` (${j.status})`]))];
    }
    if (!jobsKnown) {
      return [" · ", h("span", { class: "readiness", "data-ready": "unknown", title: "its jobs could not be read" }, badge("unknown", "readiness unknown"))];
    }
    if (settled(item.status)) {
      return [" · ", h("span", { class: "readiness", "data-ready": "true" }, badge("ready"))];
    }
    return null;
  };
  const render = () => {
    // a status that reads as done ("running") is not shown as done while a job is still on its way
    const status = liveJobs && liveJobs.length && STATUS_CLASS[item.status] === "ok" ? h("span", { class: "badge info" }, item.status) : badge(item.status);
    put(head, h("p", {}, status, " ", h("code", {}, item.id),
      item.region ? ` · ${item.region}` : "", item.health ? [" · health ", badge(item.health)] : "", readiness()));
    if (item.status_reason) head.append(h("div", { class: `notice ${item.status === "failed" ? "bad" : "warn"}` }, h("strong", {}, "Why: "), item.status_reason));
    if (item.delete_after) head.append(h("div", { class: "notice warn" }, "Deleting: the buffer ends ", when(item.delete_after), " (restore before then)."));
    const observed = item.observed;
    const rest = Object.fromEntries(Object.entries(item).filter(([k]) => !["observed", "status_reason", "id", "name", "status"].includes(k)));
    put(body, 
      observed !== undefined ? h("section", { class: "panel", "aria-labelledby": "obs-h" }, h("h2", { id: "obs-h" }, "What the last verify observed"), value(observed)) : null,
      h("section", { class: "panel", "aria-labelledby": "spec-h" }, h("h2", { id: "spec-h" }, "Details"), value(rest)));
    renderActions();
  };
  const refresh = async () => {
    try { item = (await api("GET", `${kind.plural}/${encodeURIComponent(id)}`))[kind.oneKey]; render(); } catch { /* shown next time */ }
  };
  let followLatest = () => {};
  const accepted = (r) => {
    announce(`Job ${r.job.id} ${r.job.status}`);
    followLatest(r.job.id);
    refresh();
  };
  // The action bar is redrawn on a live refresh only when what it offers changed (its buttons,
  // which are disabled and why), and the box under it holding an open form (an action's form, an
  // edit, a delete confirmation) is made once and never taken out of the page by a refresh: what
  // the user is filling in or about to click stays. The open form closes when its action is no
  // longer offered (a delete confirmation once the resource is deleting), or when it is sent.
  const formBox = h("div", {});
  let open = null; // the action whose form formBox holds (null: nothing, or a notice)
  let barKey = null;
  const openForm = (name, ...content) => { open = name; put(formBox, ...content); };
  const closeForm = () => { open = null; put(formBox, ); };
  const renderActions = () => {
    const offered = [];
    const deleting = ["deleting", "destroying"].includes(item.status);
    // actions that only read (a 200 answer, no job: the plan) — a read-only token has them too
    if (item.status !== "deleted" && !deleting) {
      for (const a of kind.actions.filter((x) => !x.op.deprecated && readsOnly(x.op))) {
        offered.push({ a, reads: true, label: a.name.replace(/-/g, " ").replace(/^./, (c) => c.toUpperCase()) });
      }
    }
    if (canWrite() && item.status !== "deleted") {
      for (const a of kind.actions) {
        if (a.op.deprecated) continue; // an older name of another action (add_target: add-target)
        if (readsOnly(a.op)) continue;
        if (a.name === "cancel-deletion" && item.status !== "deleting") continue;
        if (a.name !== "cancel-deletion" && deleting) continue;
        offered.push({ a, label: a.name === "cancel-deletion" ? "Restore" : a.name.replace(/-/g, " ").replace(/^./, (c) => c.toUpperCase()),
          why: unavailable(kind, a.name, item) });
      }
      if (kind.patch && !deleting) offered.push({ name: "edit" });
      if (kind.del && !deleting) offered.push({ name: "delete" });
    }
    const key = JSON.stringify(offered.map((o) => [o.a ? o.a.name : o.name, o.why || null]));
    if (open && !offered.some((o) => (o.a ? o.a.name : o.name) === open)) closeForm();
    if (key === barKey) return;
    barKey = key;
    for (const c of [...actionsBox.children]) if (c !== formBox) c.remove();
    if (!offered.length) { closeForm(); formBox.remove(); return; }
    const bar = h("div", { class: "bar", role: "group", "aria-label": "Actions" });
    const whys = [];
    for (const { a, label } of offered.filter((o) => o.reads)) {
      bar.append(h("button", { type: "button", "data-action": a.name, title: a.op.summary || null, onclick: async () => {
        put(readBox, h("p", { role: "status" }, `${label}…`));
        try { put(readBox, answerView(a, await api("POST", `${kind.plural}/${id}/actions/${a.name}`))); } catch (e) { put(readBox, errorNotice(e)); }
      } }, label));
    }
    for (const { a, label, why } of offered.filter((o) => o.a && !o.reads)) {
      const reqSchema = a.op.requestBody && a.op.requestBody.content["application/json"].schema;
      if (why) whys.push(`${label}: ${why}`);
      bar.append(h("button", { type: "button", "data-action": a.name, disabled: Boolean(why), title: why || null,
        "aria-describedby": why ? "actions-why" : null, onclick: async (ev) => {
        const rs = reqSchema ? resolve(state.doc, reqSchema) : {};
        // a body with nothing to fill in (no properties, no union of bodies): sent at once
        if (!reqSchema || (!Object.keys(rs.properties || {}).length && !rs.oneOf && !rs.anyOf)) {
          await inFlight(ev.currentTarget, async (key) => {
            try { closeForm(); accepted(await api("POST", `${kind.plural}/${id}/actions/${a.name}`, reqSchema ? {} : undefined, { idempotencyKey: key })); } catch (e) { openForm(null, errorNotice(e)); }
          });
          return;
        }
        openForm(a.name, h("h2", {}, label), h("p", { class: "muted" }, a.op.summary || ""),
          schemaForm(reqSchema, { submit: label, onSubmit: async (b) => { const r = await api("POST", `${kind.plural}/${id}/actions/${a.name}`, b, { idempotencyKey: newKey() }); closeForm(); accepted(r); } }));
        formBox.querySelector("input, select, textarea")?.focus();
      } }, label));
    }
    if (offered.some((o) => o.name === "edit")) {
      const ps = kind.patch.requestBody.content["application/json"].schema;
      bar.append(h("button", { type: "button", "data-action": "edit", onclick: () => {
        openForm("edit", h("h2", {}, "Edit"), schemaForm(ps, {
          submit: "Save", values: { name: item.name, labels: item.labels },
          onSubmit: async (b) => { const r = await api("PATCH", `${kind.plural}/${id}`, b); closeForm(); if (r && r.job) accepted(r); else refresh(); },
        }));
      } }, "Edit"));
    }
    if (offered.some((o) => o.name === "delete")) {
      bar.append(h("button", { type: "button", class: "danger", "data-action": "delete", onclick: () => {
        openForm("delete", h("div", { class: "notice warn", role: "alertdialog", "aria-labelledby": "del-q" },
          h("p", { id: "del-q" }, `Delete ${item.name || item.id}?`, kind.actions.some((x) => x.name === "cancel-deletion") ? " It can be restored during the deletion buffer." : " There is no buffer: it goes at once."),
          h("button", { type: "button", class: "danger", "data-action": "confirm-delete", onclick: (ev) => inFlight(ev.currentTarget, async (key) => {
            try { const r = await api("DELETE", `${kind.plural}/${id}`, undefined, { idempotencyKey: key }); closeForm(); accepted(r); } catch (e) { openForm(null, errorNotice(e)); }
          }) }, "Delete"), " ", h("button", { type: "button", onclick: closeForm }, "Keep it")));
        formBox.querySelector("[data-action=confirm-delete]").focus();
      } }, "Delete"));
    }
    // the bar and its "not now" line go before the form box, which stays where it is
    // (append(null) would show "null": only what applies is added)
    if (!formBox.isConnected) actionsBox.append(formBox);
    formBox.before(...[bar, whys.length ? h("p", { class: "muted", id: "actions-why" }, `Not now — ${whys.join("; ")}.`) : null].filter(Boolean));
  };
  // a kind's sub-resources (a cluster's kubeconfig, credentials)
  for (const s of kind.subs) {
    const params = queryParams(s.op);
    if (s.name === "kubeconfig") {
      if (!canWrite()) continue;
      const out = h("div", { role: "status" });
      subsBox.append(h("section", { class: "panel", "aria-labelledby": "kc-h" }, h("h2", { id: "kc-h" }, "Kubeconfig"),
        h("p", {}, s.op.summary || ""),
        h("button", { type: "button", "data-action": "kubeconfig", onclick: async () => {
          try {
            const r = await api("GET", `${kind.plural}/${id}/kubeconfig?expiry_s=3600`);
            const blob = new Blob([r.kubeconfig], { type: "application/yaml" });
            const a = h("a", { href: URL.createObjectURL(blob), download: `z9-${item.name}.yaml` }, "download");
            document.body.append(a); a.click(); a.remove();
            put(out, h("p", {}, `Downloaded z9-${item.name}.yaml (valid one hour; it holds a private key).`));
          } catch (e) { put(out, errorNotice(e)); }
        } }, "Download kubeconfig (1 h)"), out));
    } else if (!params.some((p) => p.required)) {
      const sec = h("section", { class: "panel", "aria-labelledby": `sub-${s.name}` }, h("h2", { id: `sub-${s.name}` }, s.name.replace(/-/g, " ")));
      subsBox.append(sec);
      api("GET", `${kind.plural}/${id}/${s.name}`).then((r) => sec.append(value(r))).catch((e) => sec.append(errorNotice(e)));
    }
  }
  render();
  // the resource's jobs: the live one (or the latest) followed as it changes
  // the resource's recent jobs: read again whenever the followed job changes (a new one, a status)
  const histBox = h("div", { class: "history" });
  // every job that touched it: its own and those of the resources another kind ties to it (a
  // server's addresses and volumes: their list takes ?server_id=), newest first
  // complete: false when a read failed (what is shown is then not all there is)
  const related = async () => {
    const param = `${kind.oneKey}_id`;
    const ids = [id];
    let complete = true;
    for (const k of state.kinds) {
      if (k === kind || !queryParams(k.listOp).some((p) => p.name === param)) continue;
      try {
        const r = await api("GET", `${k.plural}?${param}=${encodeURIComponent(id)}&limit=50&include_deleted=true`);
        ids.push(...r[k.listKey].map((x) => x.id));
      } catch { complete = false; /* that kind's jobs left out */ }
    }
    return { ids, complete };
  };
  const recentJobs = async () => {
    const { ids, complete } = await related();
    let read = complete;
    const lists = await Promise.all(ids.map((rid) => api("GET", `jobs?resource_id=${encodeURIComponent(rid)}&order=newest&limit=10&include_observe=false`)
      .then((r) => r.jobs, () => { read = false; return []; })));
    const all = lists.flat().sort((a, b) => (a.created_at < b.created_at ? 1 : a.created_at > b.created_at ? -1 : 0));
    return { jobs: all.slice(0, 15), complete: read };
  };
  // the jobs followed live: the latest one, and every other job still on its way (a server's
  // address assign once its create is done: --wait follows them all)
  const shown = new Set();
  const watch = (jobId) => {
    if (shown.has(jobId)) return;
    shown.add(jobId);
    jobBox.append(jobPanel(jobId, { onChange: () => { refresh(); loadHistory(); } }));
  };
  const isLive = (j) => ["pending", "running", "retry"].includes(j.status);
  // every job on its way is followed, a job started elsewhere (the CLI, the API) too
  const jobsRead = (list, complete) => {
    liveJobs = list.filter(isLive);
    jobsKnown = complete;
    for (const j of liveJobs) {
      if (!shown.size && !shown.has(j.id)) put(jobBox, h("h2", { id: "job-h" }, "Latest jobs"));
      watch(j.id);
    }
    render();
  };
  let histSeq = 0;
  const loadHistory = async () => {
    const seq = ++histSeq;
    try {
      const r = await recentJobs();
      if (seq !== histSeq) return;
      put(histBox, jobsTable(r.jobs, "The recent jobs of this resource and of those tied to it"));
      jobsRead(r.jobs, r.complete);
    } catch { /* shown next time */ }
  };
  // the resource and its jobs read again every POLL_MS while the page is shown (an open form
  // stays: renderActions keeps it)
  const here = location.href;
  const startPoll = () => {
    const timer = setInterval(() => {
      if (location.href !== here) { clearInterval(timer); return; }
      if (document.visibilityState === "visible") { refresh(); loadHistory(); }
    }, POLL_MS);
    state.stop.push(() => clearInterval(timer));
  };
  followLatest = (jobId) => {
    stopLive();
    startPoll();
    shown.clear();
    put(jobBox, h("h2", { id: "job-h" }, "Latest jobs"));
    watch(jobId);
    loadHistory();
  };
  const jobs = await recentJobs().catch(() => ({ jobs: [], complete: false }));
  put(histBox, jobsTable(jobs.jobs, "The recent jobs of this resource and of those tied to it"));
  main().append(h("section", { "aria-labelledby": "hist-h" }, h("h2", { id: "hist-h" }, "Recent jobs"), histBox));
  if (location.href !== here) return;
  const live = jobs.jobs.find(isLive) || jobs.jobs[0];
  if (live) followLatest(live.id);
  else { startPoll(); jobsRead(jobs.jobs, jobs.complete); }
}

// ------------------------------------------------------------------ jobs

function jobBadge(j) {
  if (j.status === "retry") return badge("retry", "retry: on its way");
  return badge(j.status);
}

function upidOf(j) {
  for (const s of j.steps || []) if (s.state === "running" && s.detail && s.detail.upid) return s.detail.upid;
  const any = (j.steps || []).map((s) => s.detail && s.detail.upid).filter(Boolean);
  return any.length ? any[any.length - 1] : null;
}

function jobsTable(jobs, caption) {
  return table(caption, ["job", "kind", "status", "attempt", "created", "error"],
    jobs.map((j) => [link(`/jobs/${j.id}`, h("code", {}, j.id)), j.kind, jobBadge(j), `${j.attempt}/${j.max_attempts}`, when(j.created_at),
      j.error ? `${j.error.class}: ${j.error.message}` : ""]), "No jobs.");
}

// A job followed live through the long-poll: each answer is a change (or the wait's end).
function jobPanel(jobId, { onChange, operator = false } = {}) {
  const box = h("div", { class: "panel job", "data-job": jobId });
  const ctl = new AbortController();
  let stopped = false;
  state.stop.push(() => { stopped = true; ctl.abort(); });
  let last = null;
  const render = (j) => {
    const steps = j.steps || [];
    const controls = h("div", { class: "bar" });
    if (canWrite() && ["pending", "retry"].includes(j.status)) {
      controls.append(h("button", { type: "button", "data-action": "cancel-job", onclick: async () => {
        try { render(await api("POST", operator ? `operator/jobs/${j.id}/actions/cancel` : `jobs/${j.id}/actions/cancel`).then((r) => r.job)); } catch (e) { box.append(errorNotice(e)); }
      } }, "Cancel job"));
    }
    if (canWrite() && !operator && j.status === "failed" && !(j.error && j.error.class === "cancelled")) {
      controls.append(h("button", { type: "button", "data-action": "rerun-job", onclick: async () => {
        try { const r = await api("POST", `jobs/${j.id}/actions/rerun`, {}); go(`/jobs/${r.job.id}`); } catch (e) { box.append(errorNotice(e)); }
      } }, "Re-run"));
    }
    put(box, 
      h("p", {}, link(`/jobs/${j.id}`, h("code", {}, j.id)), ` ${j.kind} · `, h("span", { class: "job-status", "data-status": j.status }, jobBadge(j)),
        ` · attempt ${j.attempt} of ${j.max_attempts}`, j.run_after && j.status === "retry" ? [" · next try ", when(j.run_after)] : ""),
      j.status === "retry" && j.error ? h("div", { class: "notice warn" }, h("strong", {}, "On its way: "), `the last attempt met a temporary error and will be tried again — ${j.error.message}`) : null,
      j.status === "failed" && j.error ? h("div", { class: "notice bad", role: "alert" }, h("strong", {}, `Failed (${j.error.class}): `), j.error.message,
        j.error.task_log ? h("pre", { class: "mono" }, j.error.task_log.join("\n")) : null) : null,
      j.status === "succeeded" ? h("div", { class: "notice ok" }, "Succeeded ", when(j.finished_at), ` after ${duration(j.started_at, j.finished_at)}.`) : null,
      // a multi-VM resource's job (a load balancer's appliances, a cluster's nodes): which member each step acts on
      steps.length ? table(`Steps of ${j.kind}`, [...(steps.some((s) => s.member) ? ["member"] : []), "step", "state", "started", "took", "detail"],
        steps.map((s) => [...(steps.some((x) => x.member) ? [s.member || ""] : []), s.name,
          h("span", { class: "step-state", "data-step": s.name, "data-member": s.member || null, "data-state": s.state }, badge(s.state)), when(s.started_at),
          duration(s.started_at, s.finished_at), s.detail && Object.keys(s.detail).length ? value(s.detail) : ""])) : h("p", { class: "muted" }, j.status === "pending" ? "Waiting to be picked up; its steps appear once it has looked at the world." : "No steps."),
      controls);
  };
  (async () => {
    let wait = 0;
    let lastReq = 0;
    while (!stopped) {
      const gap = Date.now() - lastReq;
      if (wait && gap < wait) await new Promise((r) => setTimeout(r, wait - gap));
      if (stopped) return;
      lastReq = Date.now();
      let j;
      try {
        // an operator follows any tenant's job by reading it every 5 s (the long-poll is the tenant's own)
        j = operator ? (await api("GET", `operator/jobs/${jobId}`, undefined, { signal: ctl.signal })).job
          : await api("GET", `jobs/${jobId}${last && !["succeeded", "failed"].includes(last.status) ? `?wait_s=${LONG_POLL_S}` : ""}`, undefined, { signal: ctl.signal });
      } catch (e) {
        if (stopped) return;
        if (e instanceof ApiError && e.status < 500 && e.status !== 429) { put(box, errorNotice(e)); return; }
        wait = MIN_GAP_MS;
        continue;
      }
      const changed = !last || last.updated_at !== j.updated_at || last.status !== j.status;
      if (changed) {
        render(j);
        if (last && last.status !== j.status) announce(`Job ${j.kind} ${j.status}`);
        if (last && onChange) onChange(j);
      }
      last = j;
      if (["succeeded", "failed"].includes(j.status)) { if (onChange && changed) onChange(j); return; }
      wait = operator || !changed ? MIN_GAP_MS : 0;
    }
  })();
  box.append(h("p", {}, "Loading the job…"));
  return box;
}

async function jobPage(id) {
  page(`Job ${id}`);
  main().append(jobPanel(id));
}

// Jobs, newest first, a page at a time (the API's page tokens: ?after=<next_after>), filtered by
// status and kind (kind: the API refuses one it does not run, naming those it does).
async function jobsPage() {
  const params = new URLSearchParams(location.search);
  const status = h("select", { id: "j-status", name: "status" }, h("option", { value: "" }, "any"),
    ...["pending", "running", "retry", "succeeded", "failed"].map((s) => h("option", { value: s }, s)));
  status.value = params.get("status") || "";
  const kindInput = h("input", { id: "j-kind", name: "kind", type: "text", placeholder: "e.g. ServerCreate", value: params.get("kind") || "" });
  const f = h("form", { class: "filters", role: "search", "aria-label": "Filter jobs" },
    h("div", { class: "field" }, h("label", { for: "j-status" }, "status"), status),
    h("div", { class: "field" }, h("label", { for: "j-kind" }, "kind"), kindInput),
    h("div", {}, h("button", { type: "submit" }, "Filter")));
  const filters = () => {
    const q = new URLSearchParams();
    if (status.value) q.set("status", status.value);
    if (kindInput.value.trim()) q.set("kind", kindInput.value.trim());
    if (params.get("limit")) q.set("limit", params.get("limit"));
    return q;
  };
  f.addEventListener("submit", (ev) => { ev.preventDefault(); const q = filters(); go(`/jobs${q.toString() ? "?" + q : ""}`); });
  const box = h("div", {});
  page("Jobs", h("p", {}, "Your tenant's jobs, newest first (the periodic observe-only ones left out)."), f, box);
  const size = Math.min(500, Math.max(1, Number(params.get("limit")) || 50));
  const q = new URLSearchParams({ order: "newest", limit: String(size), include_observe: "false" });
  for (const k of ["status", "kind", "after"]) if (params.get(k)) q.set(k, params.get(k));
  let r;
  try { r = await api("GET", `jobs?${q}`); } catch (e) { put(box, errorNotice(e)); return; }
  const nav = h("nav", { class: "bar pages", "aria-label": "Pages of jobs" },
    params.get("after") ? link(`/jobs${filters().toString() ? "?" + filters() : ""}`, "Newest") : null,
    r.next_after ? link(`/jobs?${new URLSearchParams([...filters(), ["after", r.next_after]])}`, "Older jobs →") : null);
  put(box, jobsTable(r.jobs, `Jobs: ${r.jobs.length}${params.get("after") || r.next_after ? " on this page" : ""}`), nav);
}

// ------------------------------------------------------------------ tokens

async function tokensPage() {
  const box = h("div", {});
  const secret = h("div", { role: "status" });
  const content = [h("p", {}, "Tokens of your tenant. A new token's secret is shown once."), secret];
  if (canWrite()) {
    const op = state.doc.paths["/tokens"].post;
    content.push(h("details", {}, h("summary", {}, "Create a token"),
      schemaForm(op.requestBody.content["application/json"].schema, {
        submit: "Create token",
        onSubmit: async (b) => {
          const r = await api("POST", "tokens", b);
          put(secret, h("div", { class: "secret" }, h("p", {}, h("strong", {}, `Token ${r.token.name} created. `), "Copy its secret now: it is not shown again."),
            h("label", { for: "new-secret" }, "Secret"), h("input", { id: "new-secret", type: "text", readonly: "", value: r.secret })));
          await loadTokens();
        },
      })));
  }
  content.push(box);
  page("Tokens", ...content);
  const loadTokens = async () => {
    const r = await api("GET", "tokens");
    put(box, table(`Tokens: ${r.tokens.length}`, ["name", "id", "scopes", "created", "expires", "last used", ""],
      r.tokens.map((t) => [t.name, h("code", {}, t.id), t.scopes.join(", "), when(t.created_at), when(t.expires_at), when(t.last_used_at),
        canWrite() && t.id !== state.session.token_id ? h("button", { type: "button", class: "danger", "data-action": "revoke", "aria-label": `Revoke ${t.name}`, onclick: async () => {
          try { await api("DELETE", `tokens/${t.id}`); announce(`Token ${t.name} revoked`); await loadTokens(); } catch (e) { box.prepend(errorNotice(e)); }
        } }, "Revoke") : (t.id === state.session.token_id ? "this session" : "")])));
  };
  await loadTokens();
}

// ------------------------------------------------------------------ operator

async function operatorPage() {
  if (!isOperator()) return page("Operator", h("p", {}, "This needs a token with the operator scope."));
  const params = new URLSearchParams(location.search);
  const regionsBox = h("div", {});
  const jobsBox = h("div", {});
  const guardBox = h("div", {});
  const driftBox = h("div", {});
  const mk = (name, options) => {
    const c = options ? h("select", { id: `o-${name}`, name }, h("option", { value: "" }, "any"), ...options.map((o) => h("option", { value: o }, o)))
      : h("input", { id: `o-${name}`, name, type: "text" });
    c.value = params.get(name) || "";
    return h("div", { class: "field" }, h("label", { for: `o-${name}` }, name), c);
  };
  const f = h("form", { class: "filters", role: "search", "aria-label": "Filter every tenant's jobs" },
    mk("region"), mk("kind"), mk("status", ["retry", "pending", "running", "failed", "succeeded"]), mk("tenant"),
    h("div", {}, h("button", { type: "submit" }, "Filter")));
  f.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const q = new URLSearchParams();
    for (const [k, v] of new FormData(f)) if (v) q.set(k, v);
    go(`/operator${q.toString() ? "?" + q : ""}`);
  });
  const waitingBox = h("div", {});
  page("Operator", h("h2", {}, "Regions"), regionsBox, h("h2", {}, "Who is waiting"),
    h("p", { class: "muted" }, "Each region's tenants with live jobs, most pending first: claims take tenants in turn, each tenant's jobs oldest first, up to its cap on running jobs."),
    waitingBox, h("h2", {}, "Jobs of every tenant"),
    h("p", { class: "muted" }, "Retrying, pending and running first, oldest first, then the finished ones, newest first; a page at a time, refreshed every 10 s."), f, jobsBox,
    h("h2", {}, "Deletion-guard refusals"), guardBox,
    h("h2", {}, "Drifted resources"),
    h("p", { class: "muted" }, "What the reaper's periodic plans found different from what z9 keeps (changed by hand in Proxmox, or not converged), drifted longest first."),
    driftBox);
  // a page of jobs at a time (the API's page tokens: ?after=<next_after>), the filters kept
  const size = Math.min(500, Math.max(1, Number(params.get("limit")) || 50));
  const filtered = () => {
    const q = new URLSearchParams();
    for (const k of ["region", "kind", "status", "tenant", "limit"]) if (params.get(k)) q.set(k, params.get(k));
    return q;
  };
  const load = async () => {
    const q = new URLSearchParams({ limit: String(size) });
    for (const k of ["region", "kind", "status", "tenant", "after"]) if (params.get(k)) q.set(k, params.get(k));
    // the jobs' filters are what the user typed: a refusal (a tenant's name where its id goes, a
    // page token from elsewhere) is shown under the filters, the rest of the page kept
    const [regions, jobs, guard, drift] = await Promise.all([api("GET", "operator/regions"), api("GET", `operator/jobs?${q}`).catch((e) => ({ refused: e })), api("GET", "operator/guard-refusals?limit=50"), api("GET", "operator/drift?limit=100")]);
    put(driftBox, table("Resources whose last plan found drift", ["resource", "tenant", "region", "drifted since", "drift", "steps"],
      drift.resources.map((r) => [idLink(r.id), h("code", {}, r.tenant), r.region, `${ago(r.drifted_since)} ago`,
        r.drift.map((d) => `${d.path}: want ${JSON.stringify(d.want)}, have ${JSON.stringify(d.have)}`).join("; "),
        r.steps.map((st) => `${st.name}${st.member ? ` (${st.member})` : ""}${st.disruptive ? " — disruptive" : ""}`).join(", ")]),
      "No drift: every resource checked is as z9 keeps it."));
    put(regionsBox, table("Regions: cap and live jobs", ["region", "cap", "running", "pending", "retry", "oldest pending"],
      regions.regions.map((r) => [r.name, r.max_concurrent_jobs === null ? "none" : String(r.max_concurrent_jobs), String(r.running), String(r.pending), String(r.retry),
        r.oldest_pending_at ? `${ago(r.oldest_pending_at)} ago` : "—"])));
    put(waitingBox, table("Who is waiting: tenants by pending jobs", ["region", "tenant", "pending", "running", "cap", "retry", "oldest pending waited"],
      regions.regions.flatMap((r) => [...r.tenants.map((t) => [r.name, tenantCell(t), String(t.pending), String(t.running),
        t.running_cap === null ? "none" : String(t.running_cap), String(t.retry), t.pending ? `${t.wait_s.toFixed(1)} s` : "—"]),
        ...(r.tenants_more ? [[r.name, `${r.tenants_more} more tenants`, "", "", "", "", ""]] : [])]),
      "Nobody is waiting: no live jobs."));
    put(guardBox, table("Jobs the deletion guard refused", ["job", "tenant", "region", "kind", "when", "why"],
      guard.jobs.map((j) => [link(`/operator/jobs/${j.id}`, h("code", {}, j.id)), tenantCell(j), j.region, j.kind, when(j.finished_at), j.error ? j.error.message : ""]),
      "No refusals: the deletion guard has refused nothing."));
    if (jobs.refused) {
      const field = (jobs.refused.details || []).map((d) => d.field).find(Boolean);
      const input = field && f.querySelector(`[name="${field}"]`);
      if (input) input.setAttribute("aria-invalid", "true");
      put(jobsBox, errorNotice(jobs.refused), field === "tenant" ? h("p", { class: "hint" }, "The tenant filter takes a tenant's id (ten_…): a tenant's name in the lists above shows its id on hover and links to its jobs.") : null,
        params.get("after") ? link(`/operator${filtered().toString() ? "?" + filtered() : ""}`, "First page") : null);
      return;
    }
    const pages = h("nav", { class: "bar pages", "aria-label": "Pages of jobs" },
      params.get("after") ? link(`/operator${filtered().toString() ? "?" + filtered() : ""}`, "First page") : null,
      jobs.next_after ? link(`/operator?${new URLSearchParams([...filtered(), ["after", jobs.next_after]])}`, "Next page →") : null);
    put(jobsBox, table(`Jobs: ${jobs.jobs.length}${params.get("after") || jobs.next_after ? " on this page" : ""}`, ["job", "tenant", "region", "kind", "status", "attempts", "age", "error", "UPID", ""],
      jobs.jobs.map((j) => [link(`/operator/jobs/${j.id}`, h("code", {}, j.id)), tenantCell(j), j.region, j.kind, jobBadge(j), `${j.attempt}/${j.max_attempts}`,
        ago(j.created_at), j.error ? `${j.error.class}: ${j.error.message}` : "", upidOf(j) ? h("code", {}, upidOf(j)) : "",
        canWrite() && ["pending", "retry"].includes(j.status) ? h("button", { type: "button", "data-action": "cancel-job", "aria-label": `Cancel ${j.id}`, onclick: async () => {
          try { await api("POST", `operator/jobs/${j.id}/actions/cancel`); announce(`Job ${j.id} cancelled`); await load(); } catch (e) { jobsBox.prepend(errorNotice(e)); }
        } }, "Cancel") : ""]), "No jobs match."), pages);
  };
  await load();
  const timer = setInterval(() => { if (document.visibilityState === "visible") load().catch(() => {}); }, 10000);
  state.stop.push(() => clearInterval(timer));
}

// A tenant as operators know it: its name (its id on hover), the link listing its jobs; z9's own jobs: "z9".
function tenantCell(x) {
  if (!x.tenant) return "z9";
  return link(`/operator?tenant=${encodeURIComponent(x.tenant)}`, h("span", { class: "tenant", title: x.tenant, "data-tenant": x.tenant }, x.tenant_name || x.tenant));
}

async function operatorJobPage(id) {
  const r = await api("GET", `operator/jobs/${encodeURIComponent(id)}`);
  const j = r.job;
  page(`Job ${j.id}`,
    h("dl", { class: "kv" },
      h("dt", {}, "tenant"), h("dd", {}, tenantCell(j)),
      h("dt", {}, "resource"), h("dd", {}, j.resource ? value(j.resource.id) : "—"),
      h("dt", {}, "asked by"), h("dd", {}, j.actor ? h("code", {}, j.actor) : "z9 itself"),
      h("dt", {}, "request id"), h("dd", {}, j.request_id ? h("code", {}, j.request_id) : "—"),
      h("dt", {}, "trace id"), h("dd", {}, j.trace_id ? (r.trace_url ? h("a", { href: r.trace_url, rel: "noreferrer" }, h("code", {}, j.trace_id)) : h("code", {}, j.trace_id)) : "—"),
      h("dt", {}, "lease"), h("dd", {}, j.lease_owner ? [h("code", {}, j.lease_owner), " until ", when(j.lease_expires_at)] : "—")),
    jobPanel(j.id, { operator: true }),
    h("h2", {}, "History of its resource"),
    table("Every job of this resource, oldest first", ["job", "kind", "status", "attempts", "asked by", "request", "created", "error"],
      r.history.map((x) => [link(`/operator/jobs/${x.id}`, h("code", {}, x.id)), x.kind, jobBadge(x), `${x.attempt}/${x.max_attempts}`, x.actor ? h("code", {}, x.actor) : "z9",
        x.request_id ? h("code", {}, x.request_id) : "", when(x.created_at), x.error ? `${x.error.class}: ${x.error.message}` : ""])));
}

route();
