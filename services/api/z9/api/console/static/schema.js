// Forms from the OpenAPI document: a JSON Schema (3.1: pydantic's output) becomes form fields,
// and the same schema validates the value before it is sent (the API validates again: its 422
// names the field, shown next to it).
import { h } from "./dom.js";

export function resolve(doc, schema) {
  let s = schema || {};
  for (let i = 0; i < 20 && s && s.$ref; i++) {
    const path = s.$ref.replace(/^#\//, "").split("/");
    const extra = { ...s };
    delete extra.$ref;
    s = path.reduce((o, k) => (o ? o[k] : undefined), doc) || {};
    if (Object.keys(extra).length) s = { ...s, ...extra };
  }
  return s;
}

// `X | null` (anyOf with a null branch) → X, remembering that null is allowed.
export function nonNull(doc, schema) {
  const s = resolve(doc, schema);
  const alts = s.anyOf || s.oneOf;
  if (alts) {
    const rest = alts.filter((a) => resolve(doc, a).type !== "null");
    if (rest.length === 1) {
      const base = resolve(doc, rest[0]);
      return { ...base, description: s.description || base.description, default: s.default ?? base.default,
               title: s.title || base.title, nullable: rest.length < alts.length };
    }
  }
  return s;
}

function typeOf(v) {
  if (v === null) return "null";
  if (Array.isArray(v)) return "array";
  if (typeof v === "number") return Number.isInteger(v) ? "integer" : "number";
  return typeof v;
}

function regex(p) {
  try { return new RegExp(p, "u"); } catch { try { return new RegExp(p); } catch { return null; } }
}

// The errors of `value` against `schema`: [{path, message}] ([] when it is valid).
export function validate(doc, schema, value, path = "") {
  const s = resolve(doc, schema);
  const errs = [];
  const at = (m) => errs.push({ path, message: m });
  const alts = s.anyOf || s.oneOf;
  if (alts) {
    // a branch without its own description gets the field's (a pattern's refusal says it)
    const results = alts.map((a) => {
      const r = resolve(doc, a);
      return validate(doc, s.description && !r.description ? { ...r, description: s.description } : r, value, path);
    });
    if (!results.some((r) => r.length === 0)) {
      const best = results.reduce((a, b) => (a.length <= b.length ? a : b));
      errs.push(...best);
    }
    return errs;
  }
  if (s.const !== undefined && value !== s.const) at(`must be ${JSON.stringify(s.const)}`);
  if (s.enum && !s.enum.includes(value)) at(`must be one of ${s.enum.join(", ")}`);
  const t = typeOf(value);
  const types = Array.isArray(s.type) ? s.type : s.type ? [s.type] : null;
  if (types && !types.includes(t) && !(t === "integer" && types.includes("number"))) {
    at(`must be ${types.join(" or ")}`);
    return errs;
  }
  if (t === "string") {
    const n = [...value].length;
    if (s.minLength !== undefined && n < s.minLength) at(s.minLength === 1 ? "required" : `at least ${s.minLength} characters`);
    if (s.maxLength !== undefined && n > s.maxLength) at(`at most ${s.maxLength} characters`);
    if (s.pattern) { const r = regex(s.pattern); if (r && !r.test(value)) at(patternMessage(s)); }
  }
  if (t === "integer" || t === "number") {
    if (s.minimum !== undefined && value < s.minimum) at(`at least ${s.minimum}`);
    if (s.maximum !== undefined && value > s.maximum) at(`at most ${s.maximum}`);
    if (s.exclusiveMinimum !== undefined && value <= s.exclusiveMinimum) at(`more than ${s.exclusiveMinimum}`);
    if (s.exclusiveMaximum !== undefined && value >= s.exclusiveMaximum) at(`less than ${s.exclusiveMaximum}`);
  }
  if (t === "array") {
    if (s.minItems !== undefined && value.length < s.minItems) at(`at least ${s.minItems} item(s)`);
    if (s.maxItems !== undefined && value.length > s.maxItems) at(`at most ${s.maxItems} item(s)`);
    if (s.items) value.forEach((v, i) => errs.push(...validate(doc, s.items, v, `${path}[${i}]`)));
  }
  if (t === "object") {
    const props = s.properties || {};
    for (const r of s.required || []) if (!(r in value)) errs.push({ path: join(path, r), message: "required" });
    const keys = Object.keys(value);
    if (s.maxProperties !== undefined && keys.length > s.maxProperties) at(`at most ${s.maxProperties} entries`);
    for (const k of keys) {
      if (props[k]) errs.push(...validate(doc, props[k], value[k], join(path, k)));
      else if (s.additionalProperties === false) errs.push({ path: join(path, k), message: "unknown field" });
      else if (typeof s.additionalProperties === "object") errs.push(...validate(doc, s.additionalProperties, value[k], join(path, k)));
      if (s.propertyNames) for (const e of validate(doc, s.propertyNames, k, join(path, k))) errs.push({ ...e, message: `key ${e.message}` });
    }
  }
  return errs;
}

const join = (p, k) => (p ? `${p}.${k}` : k);

// A pattern's refusal in words: the field's description (the OpenAPI document's, e.g. "DNS label,
// lower case, 1-63 chars"), never the regex itself.
function patternMessage(s) {
  const d = (s.description || "").trim().replace(/[.:;]+$/, "");
  if (d) return `must be: ${d}`;
  const p = s.pattern;
  if (p === "^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$") return "must be a DNS label: lower case letters, digits and inner hyphens, 1-63 characters";
  if (/^\^\[a-z\]?\[?a-z0-9/.test(p) && p.includes("[a-z0-9-]")) return "must be lower case letters, digits and hyphens, starting with a letter or digit";
  const id = p.match(/^\^([a-z0-9]+)_\[0-9a-z\]\{26\}\$$/);
  if (id) return `must be an id like ${id[1]}_… (26 more characters)`;
  if (p.includes("ssh-")) return "must be an SSH public key line (ssh-ed25519 AAAA… comment)";
  if (p.startsWith("^[A-Za-z0-9][A-Za-z0-9._-]*")) return "must be letters, digits, dots, underscores and hyphens, starting with a letter or digit";
  return "is not in the expected form";
}

let uid = 0;
// a field's name in words: units and acronyms the way people write them
const WORDS = { mib: "(MiB)", gib: "(GiB)", ssh: "SSH", dns: "DNS", ipv4: "IPv4", ipv6: "IPv6", ip: "IP", id: "ID", ids: "IDs",
  url: "URL", tcp: "TCP", udp: "UDP", cpu: "CPU", lb: "LB", vmid: "VM ID", mtu: "MTU", ttl: "TTL", cidr: "CIDR", s: "(s)" };
const LABELS = { dns_ptr: "Reverse DNS", public_ipv4: "Public IPv4", expiry_s: "Expiry (s)", expires_in_s: "Expires in (s)" };
export function label(name) {
  if (LABELS[name]) return LABELS[name];
  const w = name.split("_").map((x) => WORDS[x] || x).join(" ");
  return w.replace(/^./, (c) => c.toUpperCase());
}

// Form fields for an object schema. Returns {element, read()} where read() gives
// {value, errors} (errors from reading: bad JSON, not a number).
// fillFromExample: a number with no default starts at the schema's example's (a create form's
// cores, memory, disk: the OpenAPI document's example body), never in an action's form.
// refs(prefix): a promise of the tenant's resources whose ids start `<prefix>_` ([{id, label}]):
// a field holding such an id (its pattern ^srv_[0-9a-z]{26}$) is a picker of them.
// A schema that is a union of objects (oneOf/anyOf, told apart by a discriminator or a property
// each branch holds a const of: a load balancer's target, server or ip) is a select of the
// branches, then the chosen branch's fields.
export function objectFields(doc, schema, { prefix = "", values = {}, skip = [], fillFromExample = false, refs = null } = {}) {
  const s = resolve(doc, schema);
  const union = variantsOf(doc, s);
  if (union) return unionFields(doc, union, { prefix, values: values || {}, refs, required: true });
  const ex = fillFromExample && Array.isArray(s.examples) && s.examples[0] && typeof s.examples[0] === "object" ? s.examples[0] : {};
  const required = new Set(s.required || []);
  const fields = [];
  const box = h("div", { class: "fields" });
  for (const [name, raw] of Object.entries(s.properties || {})) {
    if (skip.includes(name)) continue;
    if (nonNull(doc, raw).type === "null") continue; // nothing to enter (an ip target's server_id)
    const f = field(doc, raw, join(prefix, name), name, required.has(name), (values || {})[name], ex[name], refs);
    fields.push([name, f]);
    box.append(f.element);
  }
  return {
    element: box,
    fields,
    read() {
      const out = {};
      const errors = [];
      for (const [name, f] of fields) {
        const r = f.read();
        errors.push(...r.errors);
        if (r.value !== undefined) out[name] = r.value;
      }
      return { value: out, errors };
    },
  };
}

// A union of object schemas: {key, branches: [{value, schema}]} (null: not one).
export function variantsOf(doc, raw) {
  const s = resolve(doc, raw);
  const alts = (s.oneOf || s.anyOf || []).map((a) => resolve(doc, a)).filter((a) => a.type !== "null");
  if (alts.length < 2 || !alts.every((a) => a.type === "object" && a.properties)) return null;
  const constOf = (b, k) => {
    const p = b.properties[k] && resolve(doc, b.properties[k]);
    if (!p) return undefined;
    if (p.const !== undefined) return p.const;
    return Array.isArray(p.enum) && p.enum.length === 1 ? p.enum[0] : undefined;
  };
  const key = (s.discriminator && s.discriminator.propertyName)
    || Object.keys(alts[0].properties).find((k) => alts.every((b) => constOf(b, k) !== undefined));
  if (!key || !alts.every((b) => constOf(b, key) !== undefined)) return null;
  return { key, branches: alts.map((b) => ({ value: constOf(b, key), schema: b })), description: s.description };
}

function unionFields(doc, union, { prefix, values, refs, required, name = null }) {
  const id = `f${++uid}`;
  const path = join(prefix, union.key);
  const select = h("select", { id, name: path, "data-variant": prefix || "body" },
    required ? null : h("option", { value: "" }, "—"),
    ...union.branches.map((b) => h("option", { value: String(b.value) }, String(b.value))));
  const start = values && values[union.key] !== undefined ? values[union.key] : (required ? union.branches[0].value : undefined);
  if (start !== undefined) select.value = String(start);
  const err = h("p", { class: "error", id: `${id}-err`, hidden: "" });
  select.setAttribute("aria-describedby", `${id}-err`);
  const inner = h("div", {});
  let current = null;
  const show = (keep) => {
    const b = union.branches.find((x) => String(x.value) === select.value);
    current = b ? objectFields(doc, b.schema, { prefix, values: keep || {}, skip: [union.key], refs }) : null;
    inner.replaceChildren(...(current ? [current.element] : []));
    const hint = b && b.schema.description;
    hintBox.textContent = hint || "";
    hintBox.hidden = !hint;
  };
  const hintBox = h("p", { class: "hint" });
  select.addEventListener("change", () => show(current ? current.read().value : {}));
  const element = h("div", { class: "fields union" },
    h("div", { class: "field", "data-field": path },
      h("label", { for: id }, label(name ? `${name}_${union.key}` : union.key), required ? "" : h("span", { class: "muted" }, " (optional)")),
      select, err),
    hintBox, inner);
  show(values);
  return {
    element,
    fields: [],
    read() {
      const b = union.branches.find((x) => String(x.value) === select.value);
      if (!b) return { value: undefined, errors: required ? [{ path, message: "required" }] : [] };
      const r = current.read();
      return { value: { [union.key]: b.value, ...r.value }, errors: r.errors };
    },
  };
}

// The kind prefix of a field holding another resource's id (its pattern ^srv_[0-9a-z]{26}$), or null.
export function refPrefix(s) {
  const m = s && s.type === "string" && (s.pattern || "").match(/^\^([a-z0-9]+)_\[0-9a-z\]\{26\}\$$/);
  return m ? m[1] : null;
}

// A select of the tenant's resources with that prefix (filled once refs() answers).
function picker(refs, prefix, { optional, initial, extra = [] }) {
  const select = h("select", { "data-ref": prefix },
    optional ? h("option", { value: "" }, "—") : null, ...extra.map(([v, t]) => h("option", { value: v }, t)),
    h("option", { value: "", disabled: "", "data-loading": "" }, "loading…"));
  select.dataset.state = "loading";
  refs(prefix).then((items) => {
    select.querySelector("[data-loading]")?.remove();
    for (const it of items) select.append(h("option", { value: it.id }, it.label));
    if (!items.length && !optional && !extra.length) select.append(h("option", { value: "", disabled: "" }, `none of yours (${prefix}_…)`));
    if (initial !== undefined && initial !== null && [...select.options].some((o) => o.value === String(initial))) select.value = String(initial);
    else if (!optional && !extra.length && items.length) select.value = items[0].id;
    select.dataset.state = "ready";
  }).catch(() => { select.dataset.state = "ready"; });
  return select;
}

function field(doc, raw, path, name, required, initial, exampleValue, refs = null) {
  const s = nonNull(doc, raw);
  const union = variantsOf(doc, s);
  if (union) { // a union of objects: its own fieldset, the branch chosen by a select
    const optional = !required;
    const u = unionFields(doc, union, { prefix: path, values: initial || {}, refs, required, name });
    const fs = h("fieldset", { "data-group": path }, h("legend", {}, label(name), optional ? " (optional)" : ""),
      s.description || union.description ? h("p", { class: "hint" }, s.description || union.description) : null, u.element);
    return { element: fs, read: () => u.read() };
  }
  const items = s.type === "array" ? nonNull(doc, s.items) : null;
  if (items && ((items.type === "object" && items.properties) || variantsOf(doc, items))) {
    return rowsField(doc, s, path, name, required, initial, refs);
  }
  const id = `f${++uid}`;
  const hintId = `${id}-hint`;
  const errId = `${id}-err`;
  let hintText = [s.description, constraintText(s)].filter(Boolean).join(" · ");
  let exampleText = "";
  const err = h("p", { class: "error", id: errId, hidden: "" });
  const wrap = (control, extra = {}) => {
    control.id = id;
    control.name = path;
    control.setAttribute("aria-describedby", [hintText || exampleText ? hintId : null, errId].filter(Boolean).join(" "));
    if (required) control.setAttribute("aria-required", "true");
    const el = h("div", { class: "field", "data-field": path, ...extra },
      h("label", { for: id }, label(name), required ? "" : h("span", { class: "muted" }, " (optional)")),
      hintText || exampleText ? h("p", { class: "hint", id: hintId }, hintText,
        exampleText ? [hintText ? " · " : "", "Example: ", h("code", { class: "example" }, exampleText)] : null) : null, control, err);
    return el;
  };
  const t = s.type;
  let control;
  let read;
  if (s.enum) {
    control = h("select", {}, required ? null : h("option", { value: "" }, "—"),
      ...s.enum.map((v) => h("option", { value: String(v) }, String(v))));
    // a version with no default: the newest offered (the enum lists them oldest first)
    const start = initial ?? s.default ?? (name === "version" && s.enum.length ? s.enum[s.enum.length - 1] : undefined);
    if (start !== undefined && start !== null) control.value = String(start);
    read = () => (control.value === "" ? undefined : s.enum.find((v) => String(v) === control.value));
  } else if (t === "boolean") {
    control = h("input", { type: "checkbox" });
    control.checked = Boolean(initial ?? s.default);
    read = () => (control.checked ? true : (required || s.default !== undefined ? false : undefined));
  } else if (t === "integer" || t === "number") {
    control = h("input", { type: "number", inputmode: "numeric", step: t === "integer" ? "1" : "any" });
    if (s.minimum !== undefined) control.min = s.minimum;
    if (s.maximum !== undefined) control.max = s.maximum;
    const start = initial ?? s.default ?? s.example ?? (Array.isArray(s.examples) ? s.examples[0] : undefined)
      ?? (typeof exampleValue === "number" ? exampleValue : undefined);
    if (start !== undefined && start !== null) control.value = String(start);
    read = () => {
      const v = control.value.trim();
      if (v === "") return undefined;
      const n = Number(v);
      if (!Number.isFinite(n)) throw new Error("must be a number");
      return n;
    };
  } else if (t === "string" && refs && refPrefix(s)) {
    control = picker(refs, refPrefix(s), { optional: !required, initial });
    read = () => (control.value === "" ? undefined : control.value);
  } else if (refs && boolOrRef(doc, s)) {
    // true: a new one; an id: that one of yours; — : the default (false)
    const prefix = boolOrRef(doc, s);
    control = picker(refs, prefix, { optional: true, initial: initial === true ? "true" : initial,
                                     extra: [["true", `a new one`]] });
    read = () => (control.value === "" ? undefined : control.value === "true" ? true : control.value);
  } else if (t === "string") {
    control = h("input", { type: "text", autocomplete: "off", spellcheck: "false" });
    if (s.maxLength) control.maxLength = s.maxLength;
    const start = initial ?? s.default;
    if (start !== undefined && start !== null) control.value = String(start);
    read = () => (control.value === "" ? undefined : control.value);
  } else if (t === "array" && ["string"].includes(nonNull(doc, s.items).type) && !nonNull(doc, s.items).enum) {
    control = h("textarea", { rows: "3" });
    if (Array.isArray(initial)) control.value = initial.join("\n");
    read = () => { const v = control.value.split("\n").map((x) => x.trim()).filter(Boolean); return v.length ? v : undefined; };
  } else if (t === "object" && !s.properties && s.additionalProperties && nonNull(doc, s.additionalProperties).type === "string") {
    control = h("textarea", { rows: "3", placeholder: "key=value, one a line" });
    if (initial && typeof initial === "object") control.value = Object.entries(initial).map(([k, v]) => `${k}=${v}`).join("\n");
    read = () => {
      const out = {};
      for (const line of control.value.split("\n").map((x) => x.trim()).filter(Boolean)) {
        const i = line.indexOf("=");
        if (i < 0) throw new Error(`"${line}": write key=value`);
        out[line.slice(0, i).trim()] = line.slice(i + 1).trim();
      }
      return Object.keys(out).length || initial ? out : undefined;
    };
  } else if (t === "object" && s.properties) {
    const inner = objectFields(doc, s, { prefix: path, values: initial || {}, refs });
    const enable = required ? null : h("input", { type: "checkbox", id: `${id}-on` });
    const fs = h("fieldset", { "data-field": path }, h("legend", {}, label(name), required ? "" : " (optional)"),
      s.description ? h("p", { class: "hint" }, s.description) : null,
      enable ? h("div", {}, enable, h("label", { for: `${id}-on` }, ` Set ${label(name).toLowerCase()}`)) : null,
      inner.element);
    if (enable) {
      inner.element.hidden = !initial;
      enable.checked = Boolean(initial);
      enable.addEventListener("change", () => { inner.element.hidden = !enable.checked; });
    }
    return {
      element: fs,
      read() {
        if (enable && !enable.checked) return { value: undefined, errors: [] };
        return inner.read();
      },
      showErrors() {},
    };
  } else {
    // anything else (a list of objects, a union): JSON, validated by the same schema
    const ex = example(doc, s);
    control = h("textarea", { rows: "5", placeholder: ex });
    if (ex !== "JSON") exampleText = ex;
    if (initial !== undefined) control.value = JSON.stringify(initial, null, 2);
    read = () => {
      const v = control.value.trim();
      if (v === "") return undefined;
      try { return JSON.parse(v); } catch { throw new Error("not valid JSON"); }
    };
  }
  const element = wrap(control);
  return {
    element,
    control,
    err,
    read() {
      try {
        const value = read();
        if (value === undefined && required) return { value, errors: [{ path, message: "required" }] };
        return { value, errors: [] };
      } catch (e) {
        return { value: undefined, errors: [{ path, message: e.message }] };
      }
    },
  };
}

// anyOf [boolean, an id of kind <prefix>] (a server's public_ipv4): the prefix, else null.
function boolOrRef(doc, s) {
  const alts = (s.anyOf || s.oneOf || []).map((a) => nonNull(doc, a)).filter((a) => a.type !== "null");
  if (alts.length !== 2 || !alts.some((a) => a.type === "boolean")) return null;
  const ref = alts.find((a) => refPrefix(a));
  return ref ? refPrefix(ref) : null;
}

// An array of objects (or of a union of them): a group of rows, each the item's fields, added
// and removed with buttons (data-add, data-remove: the tests find them by path).
function rowsField(doc, s, path, name, required, initial, refs) {
  const id = `f${++uid}`;
  const err = h("p", { class: "error", id: `${id}-err`, hidden: "" });
  const list = h("div", { class: "rows" });
  let rows = [];
  const one = label(name).replace(/s$/, "").toLowerCase();
  const render = (values) => {
    rows = values.map((v, i) => {
      const f = objectFields(doc, s.items, { prefix: `${path}[${i}]`, values: v || {}, refs });
      const rm = h("button", { type: "button", "data-remove": `${path}[${i}]`, "aria-label": `Remove ${one} ${i + 1}` }, "Remove");
      rm.addEventListener("click", () => render(rows.filter((_, j) => j !== i).map((r) => r.read().value)));
      const fs = h("fieldset", { class: "row", "data-row": `${path}[${i}]` }, h("legend", {}, `${label(name).replace(/s$/, "")} ${i + 1}`), f.element, h("div", {}, rm));
      return { element: fs, read: () => f.read() };
    });
    list.replaceChildren(...rows.map((r) => r.element));
  };
  const start = Array.isArray(initial) ? initial : Array.from({ length: Math.max(s.minItems || 0, required ? 1 : 0) }, () => ({}));
  render(start);
  const add = h("button", { type: "button", "data-add": path }, `Add ${one}`);
  add.addEventListener("click", () => {
    render([...rows.map((r) => r.read().value), {}]);
    list.lastElementChild?.querySelector("input, select, textarea")?.focus();
  });
  const element = h("div", { class: "field group", "data-field": path },
    h("fieldset", {}, h("legend", {}, label(name), required ? "" : " (optional)"),
      s.description ? h("p", { class: "hint" }, s.description) : null, list, h("div", {}, add), err));
  return {
    element,
    read() {
      const values = [];
      const errors = [];
      for (const r of rows) { const x = r.read(); values.push(x.value); errors.push(...x.errors); }
      if (!values.length && !required) return { value: undefined, errors };
      return { value: values, errors };
    },
  };
}

// A JSON field's example: the schema's own, else one built from its (item) schema's required fields.
export function example(doc, s) {
  if (s.examples && s.examples.length) return JSON.stringify(s.examples[0]);
  if (s.example !== undefined) return JSON.stringify(s.example);
  const alts = s.anyOf || s.oneOf;
  if (alts && alts.every((a) => ["boolean", "string", "integer", "number"].includes(nonNull(doc, a).type))) {
    return alts.map((a) => JSON.stringify(sample(doc, a, 1))).join(" or ");
  }
  const v = sample(doc, s, 0);
  return v === undefined ? "JSON" : JSON.stringify(v);
}

function sample(doc, raw, depth) {
  const s = nonNull(doc, raw);
  if (depth > 4) return undefined;
  if (s.examples && s.examples.length) return s.examples[0];
  if (s.example !== undefined) return s.example;
  if (s.const !== undefined) return s.const;
  if (s.default !== undefined && s.default !== null) return s.default;
  if (s.enum && s.enum.length) return s.enum[0];
  const alts = s.anyOf || s.oneOf;
  if (alts && alts.length) return sample(doc, alts[0], depth + 1);
  switch (s.type) {
    case "array": { const i = sample(doc, s.items || {}, depth + 1); return i === undefined ? [] : [i]; }
    case "object": {
      const out = {};
      const req = s.required || [];
      for (const k of req) { const v = sample(doc, (s.properties || {})[k] || {}, depth + 1); out[k] = v === undefined ? null : v; }
      return out;
    }
    case "integer": case "number": return s.minimum ?? (s.exclusiveMinimum !== undefined ? s.exclusiveMinimum + 1 : 1);
    case "boolean": return true;
    case "string": {
      const id = (s.pattern || "").match(/^\^([a-z0-9]+)_\[0-9a-z\]\{26\}\$$/);
      if (id) return `${id[1]}_…`;
      return s.format === "ipv4" ? "192.0.2.10" : "…";
    }
    default: return undefined;
  }
}

function constraintText(s) {
  const parts = [];
  if (s.minimum !== undefined && s.maximum !== undefined) parts.push(`${s.minimum}–${s.maximum}`);
  else if (s.minimum !== undefined) parts.push(`≥ ${s.minimum}`);
  else if (s.maximum !== undefined) parts.push(`≤ ${s.maximum}`);
  if (s.maxLength !== undefined && s.type === "string") parts.push(`up to ${s.maxLength} characters`);
  return parts.join(", ");
}

// Show errors [{path, message}] next to their fields inside `form`; the rest in `summary`.
export function showErrors(form, errors, summary) {
  for (const el of form.querySelectorAll(".field .error")) { el.hidden = true; el.textContent = ""; }
  for (const el of form.querySelectorAll("[aria-invalid]")) el.removeAttribute("aria-invalid");
  const loose = [];
  for (const e of errors) {
    let p = e.path;
    let box = null;
    while (p && !(box = form.querySelector(`.field[data-field="${CSS.escape(p)}"]`))) {
      p = p.includes(".") || p.includes("[") ? p.replace(/(\.[^.[]*|\[\d+\])$/, "") : "";
    }
    if (box) {
      const err = box.querySelector(".error");
      err.hidden = false;
      err.textContent = err.textContent ? `${err.textContent}; ${e.path !== p ? e.path + ": " : ""}${e.message}` : `${e.path !== p ? e.path + ": " : ""}${e.message}`;
      const c = box.querySelector("input, select, textarea");
      if (c) c.setAttribute("aria-invalid", "true");
    } else loose.push(e);
  }
  summary.replaceChildren();
  summary.hidden = errors.length === 0;
  if (errors.length) {
    summary.append(h("p", {}, `${errors.length} field${errors.length > 1 ? "s" : ""} to fix before sending:`),
      h("ul", {}, ...errors.map((e) => h("li", {}, `${e.path || "body"}: ${e.message}`))));
    const first = form.querySelector("[aria-invalid=true]");
    (first || summary).focus();
  }
  return loose;
}
