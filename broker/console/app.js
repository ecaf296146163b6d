// Narad's console: a page over the node's own HTTP API, with the user's
// own credentials (kept for this tab only, in sessionStorage; never in a
// URL, a cookie or localStorage). Everything shown comes from the API, and
// every refusal is shown with the API's message. No other origin is used.
"use strict";

const REFRESH_MS = 5000;
// Messages per page of the browser.
const BROWSE_PAGE = 20;
const CREDENTIAL = "narad.credential";
const WHO = "narad.who";
const PENDING_WHO = "narad.pending-who";
const main = document.getElementById("main");
const notice = document.getElementById("notice");
let refreshTimer = null;
// Which page is shown: a refresh of a page left behind changes nothing.
let shown = 0;

// ---------------------------------------------------------------- the API

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

async function api(method, path, body, extraHeaders) {
  const headers = Object.assign({}, extraHeaders || {});
  const credential = sessionStorage.getItem(CREDENTIAL);
  if (credential) headers["Authorization"] = credential;
  // "omit": a 401 never opens the browser's own sign-in prompt (the
  // page asks, in its form); the credential goes in the header.
  const init = { method, headers, credentials: "omit" };
  if (body !== undefined) {
    init.body = typeof body === "string" ? body : JSON.stringify(body);
  }
  const response = await fetch(path, init);
  const text = await response.text();
  let answer = null;
  try { answer = text ? JSON.parse(text) : null; } catch (_) { answer = null; }
  if (!response.ok) {
    const error = answer && answer.error ? answer.error : { code: "unknown", message: text };
    throw new ApiError(response.status, error.code, error.message);
  }
  return answer;
}

const seg = encodeURIComponent;

// ---------------------------------------------------------- page helpers

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === false || value === null || value === undefined) continue;
    if (name === "class") node.className = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

// What names a control across a re-render: its kind and its name.
function controlName(node) {
  return `${node.tagName}|${node.getAttribute("aria-label") || node.getAttribute("href") || node.textContent}`;
}

// Puts `children` in `node` in place of what it held; null, undefined and
// false are left out (replaceChildren would print them). A control that
// had the keyboard's focus keeps it in the new content (a refresh every
// 5 s must not throw a keyboard user back to the top).
function put(node, ...children) {
  const active = document.activeElement;
  const focused = active && active !== node && node.contains(active) ? controlName(active) : null;
  node.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
  if (focused) {
    const again = Array.from(node.querySelectorAll("a, button, input, select, textarea")).find((c) => controlName(c) === focused);
    if (again) again.focus();
  }
}

function button(label, onclick, attrs) {
  return el("button", Object.assign({ type: "button", onclick }, attrs || {}), label);
}

function field(label, input) {
  return el("label", {}, label, input);
}

function table(columns, rows) {
  const head = el("tr", {}, columns.map(([name, numeric]) => el("th", numeric ? { class: "num", scope: "col" } : { scope: "col" }, name)));
  const body = rows.map((cells) => el("tr", {}, cells.map((cell, i) => el("td", columns[i][1] ? { class: "num" } : {}, cell))));
  return el("div", { class: "table-wrap" }, el("table", {}, el("thead", {}, head), el("tbody", {}, body)));
}

function when(ms) {
  if (!ms) return "-";
  const date = new Date(ms);
  const ago = Math.round((Date.now() - ms) / 1000);
  const relative = ago < 0 ? `in ${age(-ago * 1000)}` : ago < 60 ? `${ago} s ago` : ago < 3600 ? `${Math.round(ago / 60)} min ago` : `${Math.round(ago / 3600)} h ago`;
  return el("time", { datetime: date.toISOString(), title: date.toISOString() }, `${relative} (${date.toLocaleString()})`);
}

function age(ms) {
  if (!ms) return "0 s";
  return ms < 60000 ? `${Math.round(ms / 1000)} s` : ms < 3600000 ? `${Math.round(ms / 60000)} min` : `${(ms / 3600000).toFixed(1)} h`;
}

function errorText(error) {
  return error instanceof ApiError ? `${error.status} ${error.code}: ${error.message}` : String(error);
}

function showError(error, where) {
  if (error instanceof ApiError && error.status === 401) return signIn(error.message);
  put(where || main, el("p", { class: "error", role: "alert" }, errorText(error)));
}

function said(where, text) {
  put(where, el("p", { class: "ok", role: "status" }, text));
}

// Runs an action of a form or button: its answer or its refusal is shown
// in `where`; the button stays disabled while it runs.
async function act(where, control, action) {
  if (control) control.disabled = true;
  try {
    await action();
  } catch (error) {
    showError(error, where);
  } finally {
    if (control) control.disabled = false;
  }
}

// A numeric input's value, or undefined when left empty (then not sent).
function numberOf(input) {
  return input.value === "" ? undefined : Number(input.value);
}

// Asks the user; resolves true for Confirm. `confirmLabel` null: only Cancel.
function confirmDialog(title, body, confirmLabel) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-title").textContent = title;
  put(document.getElementById("confirm-body"), ...body);
  const yes = document.getElementById("confirm-yes");
  yes.hidden = confirmLabel === null;
  yes.textContent = confirmLabel || "Confirm";
  dialog.returnValue = "";
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "yes"), { once: true });
    dialog.showModal();
  });
}

// A form field that must hold `name` before `target` may be pressed.
function typedConfirmation(name, target) {
  const input = el("input", { name: "confirm-name", autocomplete: "off" });
  target.disabled = true;
  input.addEventListener("input", () => { target.disabled = input.value !== name; });
  return [field(`Type ${name} to confirm`, input), input];
}

// A message's value: JSON pretty-printed, text as it is, binary (bytes
// that are not UTF-8, or text with control characters) in hex.
function hexOf(bytes) {
  return el("pre", { class: "value" }, `hex: ${Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join(" ")}`);
}

function valueOf(message) {
  if (message.value === undefined) {
    return hexOf(Uint8Array.from(atob(message.value_base64 || ""), (c) => c.charCodeAt(0)));
  }
  if (/[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f]/.test(message.value)) {
    return hexOf(new TextEncoder().encode(message.value));
  }
  try {
    const parsed = JSON.parse(message.value);
    if (parsed !== null && typeof parsed === "object") {
      return el("pre", { class: "value" }, JSON.stringify(parsed, null, 2));
    }
  } catch (_) { /* not JSON */ }
  return el("pre", { class: "value" }, message.value);
}

function polyline(values, width, height) {
  // One point (a node that just started) is drawn as a flat line.
  if (values.length === 1) values = [values[0], values[0]];
  const max = Math.max(1, ...values);
  const step = values.length > 1 ? width / (values.length - 1) : width;
  const points = values.map((v, i) => `${(i * step).toFixed(1)},${(height - 2 - (v / max) * (height - 4)).toFixed(1)}`).join(" ");
  const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  line.setAttribute("points", points);
  return line;
}

function svg(cls, width, height, label) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  node.setAttribute("class", cls);
  node.setAttribute("viewBox", `0 0 ${width} ${height}`);
  node.setAttribute("preserveAspectRatio", "none");
  node.setAttribute("role", "img");
  node.setAttribute("aria-label", label);
  return node;
}

// A line chart of numbers, oldest first.
function chart(label, values) {
  const latest = values.length ? values[values.length - 1] : 0;
  const highest = Math.max(0, ...values);
  const text = `${label} (latest ${latest}, highest ${highest})`;
  const node = svg("chart", 360, 60, text);
  if (values.length) node.append(polyline(values, 360, 60));
  return el("figure", {}, el("figcaption", { class: "muted" }, text), node);
}

// The small backlog chart of the topics list.
function sparkline(label, values) {
  const node = svg("spark", 100, 20, `${label}: latest ${values.length ? values[values.length - 1] : 0}`);
  if (values.length) node.append(polyline(values, 100, 20));
  return node;
}

// ---------------------------------------------------------------- cluster

async function clusterPage(view) {
  const summary = el("p");
  const nodes = el("div");
  const moves = el("div");
  const result = el("div", { "aria-live": "polite" });
  let refresh;
  const plan = (title, path) => act(result, null, async () => {
    const dry = await api("POST", `${path}?dry_run=true`);
    const list = dry.moves.map((m) => el("li", {}, `${m.topic} partition ${m.partition}: node ${m.from} → node ${m.to}`));
    const body = list.length
      ? [el("p", {}, `${list.length} partition${list.length === 1 ? "" : "s"} will move:`), el("ul", { class: "plan" }, list)]
      : [el("p", {}, "Nothing needs to move now.")];
    const decommission = path.endsWith("/decommission");
    if (!(await confirmDialog(title, body, list.length || decommission ? title : null))) return;
    const planned = await api("POST", path);
    said(result, `${title}: ${planned.moves.length} move${planned.moves.length === 1 ? "" : "s"} planned.`);
    await refresh();
  });
  put(view,
    el("h1", {}, "Cluster"),
    summary,
    el("h2", {}, "Nodes"),
    nodes,
    el("div", { class: "buttons" }, button("Rebalance…", () => plan("Rebalance", "/v1/cluster/rebalance"))),
    result,
    el("h2", {}, "Moves"),
    moves,
  );
  refresh = async () => {
    const cluster = await api("GET", "/v1/cluster");
    summary.textContent = `Cluster ${cluster.cluster_id || "-"}, leader node ${cluster.leader ?? "-"}, term ${cluster.term ?? "-"}.`;
    // A node of an earlier release does not say whether its peers are ready.
    const readiness = (n) => n.ready === undefined ? "-"
      : n.ready ? "ready" : `not ready: ${n.not_ready ? n.not_ready.message : "no reason given"}`;
    put(nodes, table(
      [["Node"], ["Address"], ["State"], ["Partitions", true], ["Readiness"], ["Actions"]],
      cluster.nodes.map((n) => [String(n.id), n.addr, n.state, String(n.partitions), readiness(n),
        n.state === "alive" && cluster.nodes.length > 1
          ? button(`Decommission node ${n.id}…`, () => plan(`Decommission node ${n.id}`, `/v1/cluster/nodes/${n.id}/decommission`))
          : ""]),
    ));
    const listed = await api("GET", "/v1/cluster/moves");
    const running = listed.moves.filter((m) => ["planned", "copying", "freezing"].includes(m.state));
    const ended = listed.moves.filter((m) => !running.includes(m)).slice(-10).reverse();
    const rows = (list) => list.map((m) => [m.topic, String(m.partition), String(m.from), String(m.to), m.state,
      m.total_bytes ? `${Math.round((100 * m.copied_bytes) / m.total_bytes)} %` : "-",
      m.state === "planned" || m.state === "copying" || m.state === "freezing" ? when(m.expected_end_ms) : when(m.finished_at_ms)]);
    const columns = [["Topic"], ["Partition", true], ["From", true], ["To", true], ["State"], ["Copied", true]];
    put(moves,
      running.length === 0 ? el("p", { class: "muted" }, "No moves in flight.") : table([...columns, ["Expected end"]], rows(running)),
      ended.length === 0 ? null : el("h3", {}, "Last ended"),
      ended.length === 0 ? null : table([...columns, ["Ended"]], rows(ended)),
    );
  };
  return refresh;
}

// ----------------------------------------------------------------- topics

async function topicsPage(view) {
  const list = el("div");
  const created = el("div", { "aria-live": "polite" });
  const name = el("input", { name: "name", required: true, pattern: "[A-Za-z0-9._\\-]{1,249}", autocomplete: "off" });
  const partitions = el("input", { name: "partitions", type: "number", min: "1", max: "1024", placeholder: "8" });
  const visibility = el("input", { name: "visibility_timeout_ms", type: "number", min: "1", placeholder: "30000" });
  const retention = el("input", { name: "retention_ms", type: "number", min: "0", placeholder: "the node's default" });
  const maxDeliveries = el("input", { name: "max_deliveries", type: "number", min: "0", placeholder: "0 (unlimited)" });
  const deadLetter = el("input", { name: "dead_letter_topic", autocomplete: "off" });
  const submit = el("button", { type: "submit" }, "Create topic");
  const form = el("form", {
    class: "inline",
    onsubmit: (event) => {
      event.preventDefault();
      act(created, submit, async () => {
        const body = {
          partitions: numberOf(partitions),
          visibility_timeout_ms: numberOf(visibility),
          retention_ms: numberOf(retention),
          max_deliveries: numberOf(maxDeliveries),
          dead_letter_topic: deadLetter.value || undefined,
        };
        // PUT also changes a topic that exists: this form only creates.
        const listed = await api("GET", "/v1/topics");
        if (listed.topics.some((t) => t.name === name.value)) {
          throw new Error(`A topic named ${name.value} exists already; change it on its own page.`);
        }
        await api("PUT", `/v1/topics/${seg(name.value)}`, body);
        location.hash = `#/topics/${seg(name.value)}`;
      });
    },
  }, field("Name", name), field("Partitions", partitions), field("Visibility timeout (ms)", visibility),
  field("Retention (ms)", retention), field("Max deliveries", maxDeliveries), field("Dead-letter topic", deadLetter), submit);
  put(view, el("h1", {}, "Topics"), list, el("section", { class: "card" }, el("h2", {}, "Create a topic"), form, created));
  // Topics this user may not describe (no `admin`): asked once, then
  // their figures come from the rates (`consume` suffices) alone.
  const refused = new Map();
  const figures = async (topic) => {
    const path = `/v1/topics/${seg(topic.name)}`;
    const [detail, rates] = await Promise.all([
      refused.has(topic.name) ? refused.get(topic.name) : api("GET", path).catch((error) => error),
      api("GET", `${path}/rates`).catch((error) => error),
    ]);
    if (detail instanceof ApiError && detail.status === 403) refused.set(topic.name, detail);
    const backlog = rates instanceof Error ? "" : sparkline(`Backlog of ${topic.name}`, rates.points.map((p) => p.available + p.in_flight));
    if (!(detail instanceof Error)) {
      const stats = detail.partition_stats || [];
      return [String(stats.reduce((s, p) => s + p.available, 0)), String(stats.reduce((s, p) => s + p.in_flight, 0)),
        age(Math.max(0, ...stats.map((p) => p.oldest_unacked_age_ms))), backlog];
    }
    if (!(rates instanceof Error)) {
      const last = rates.points[rates.points.length - 1];
      return [last ? String(last.available) : "-", last ? String(last.in_flight) : "-", "-", backlog];
    }
    return [el("span", { class: "error" }, errorText(detail)), "-", "-", ""];
  };
  return async () => {
    const listed = await api("GET", "/v1/topics");
    const rows = await Promise.all(listed.topics.map(async (topic) =>
      [el("a", { href: `#/topics/${seg(topic.name)}` }, topic.name), String(topic.partitions), ...(await figures(topic))]));
    put(list, rows.length === 0 ? el("p", { class: "muted" }, "No topics you may see.") : table(
      [["Topic"], ["Partitions", true], ["Available", true], ["In flight", true], ["Oldest unacked", true], ["Backlog, 15 min"]], rows));
  };
}

// ------------------------------------------------------------------ topic

// The browser's place in the topic shown: partition and offset.
const browsing = { topic: null, partition: 0, offset: null };

async function topicPage(view, name) {
  if (browsing.topic !== name) Object.assign(browsing, { topic: name, partition: 0, offset: null });
  const path = `/v1/topics/${seg(name)}`;
  // The list gives every topic the user holds a grant on with its
  // settings; describing one (its partition figures and children) needs
  // `admin`. Without it, the page shows what the user may do (browse,
  // search, rates, produce) and the describe's refusal where the figures
  // would be.
  const everyTopic = await api("GET", "/v1/topics");
  const listed = everyTopic.topics.find((t) => t.name === name);
  const described = await api("GET", path).catch((error) => error);
  const admin = !(described instanceof Error);
  if (!admin && !(described instanceof ApiError && described.status === 403 && listed)) throw described;
  const topic = admin ? described : listed;
  const feeding = everyTopic.topics.filter((t) => t.dead_letter_topic === name).map((t) => t.name);
  // The redrive card: for a dead-letter topic, or one with redrives.
  const redrives = admin ? await api("GET", `${path}/redrive`) : { tasks: [] };
  const partitions = el("div");
  const charts = el("div", { class: "charts" });
  const children = el("div");
  const browser = el("section", { "aria-label": "Messages" });
  const found = el("section", { "aria-label": "Search results" });
  const tasks = el("div");
  const redriveSection = admin && (feeding.length || redrives.tasks.length) ? redriveCard(name, feeding, tasks) : null;
  if (!admin) {
    const why = el("p", { class: "error" }, errorText(described));
    put(partitions, why);
    put(children, why.cloneNode(true));
  }
  put(view,
    el("h1", {}, `Topic ${topic.name}`),
    topic.parent ? el("p", { class: "muted" }, "A child of ", el("a", { href: `#/topics/${seg(topic.parent)}` }, topic.parent)) : null,
    el("h2", {}, "Partitions"),
    partitions,
    el("h2", {}, "Last 15 minutes"),
    charts,
    el("h2", {}, "Children"),
    children,
    redriveSection,
    el("h2", {}, "Messages"),
    browseForm(topic, browser),
    browser,
    el("h2", {}, "Search"),
    searchForm(topic, found),
    found,
    produceCard(topic),
    admin ? settingsCard(topic) : null,
    admin ? deleteCard(topic) : null,
  );
  browse(browser);
  return async () => {
    const now = admin ? await api("GET", path) : null;
    if (now) put(partitions, table(
      [["Partition", true], ["Owner", true], ["High watermark", true], ["Frontier", true], ["Available", true], ["In flight", true], ["Oldest unacked", true]],
      (now.partition_stats || []).map((p) => [String(p.partition), String(p.owner), String(p.high_watermark), String(p.frontier), String(p.available), String(p.in_flight), age(p.oldest_unacked_age_ms)]),
    ));
    if (now) put(children, (now.children || []).length === 0 ? el("p", { class: "muted" }, "No children.") : table(
      [["Child"], ["Kind"], ["Lag (messages)", true], ["Lag", true], ["Dropped", true], ["State"], ["Last error"]],
      now.children.map((c) => [c.kind === "remote" ? c.name : el("a", { href: `#/topics/${seg(c.name)}` }, c.name), c.kind,
        String(c.lag_messages), age((c.lag_seconds || 0) * 1000), String(c.dropped_messages), c.state, c.last_error || ""]),
    ));
    try {
      const rates = await api("GET", `${path}/rates`);
      const points = rates.points || [];
      put(charts,
        chart("Produced per 5 s", points.map((p) => p.produced)),
        chart("Acked per 5 s", points.map((p) => p.acked)),
        chart("Backlog", points.map((p) => p.available + p.in_flight)),
      );
    } catch (error) {
      showError(error, charts);
    }
    if (redriveSection) await redriveTasks(name, tasks);
  };
}

function settingsCard(topic) {
  const result = el("div", { "aria-live": "polite" });
  const inputs = {
    partitions: el("input", { name: "partitions", type: "number", min: String(topic.partitions), max: "1024", value: String(topic.partitions) }),
    visibility_timeout_ms: el("input", { name: "visibility_timeout_ms", type: "number", min: "1", value: String(topic.visibility_timeout_ms) }),
    retention_ms: el("input", { name: "retention_ms", type: "number", min: "0", value: String(topic.retention_ms) }),
    max_deliveries: el("input", { name: "max_deliveries", type: "number", min: "0", value: String(topic.max_deliveries) }),
    dead_letter_topic: el("input", { name: "dead_letter_topic", autocomplete: "off", value: topic.dead_letter_topic || "" }),
    schema: el("input", { name: "schema", autocomplete: "off", value: topic.schema || "" }),
    max_message_bytes: el("input", { name: "max_message_bytes", type: "number", min: "1", value: String(topic.max_message_bytes) }),
    idempotency_window_ms: el("input", { name: "idempotency_window_ms", type: "number", min: "0", value: String(topic.idempotency_window_ms) }),
  };
  const labels = {
    partitions: "Partitions (only more)", visibility_timeout_ms: "Visibility timeout (ms)", retention_ms: "Retention (ms, 0 = forever)",
    max_deliveries: "Max deliveries (0 = unlimited)", dead_letter_topic: "Dead-letter topic", schema: "Schema", max_message_bytes: "Max message bytes",
    idempotency_window_ms: "Idempotency window (ms)",
  };
  const save = el("button", { type: "submit" }, "Save settings");
  const form = el("form", {
    class: "inline",
    onsubmit: (event) => {
      event.preventDefault();
      act(result, save, async () => {
        // Only what changed is sent: PUT merges.
        const body = {};
        for (const [key, input] of Object.entries(inputs)) {
          const before = topic[key] ?? "";
          const value = input.type === "number" ? numberOf(input) : (input.value === "" ? null : input.value);
          // An emptied number keeps its value (only text fields clear).
          if (value !== undefined && String(value ?? "") !== String(before)) body[key] = value;
        }
        if (Object.keys(body).length === 0) return said(result, "Nothing changed.");
        const saved = await api("PUT", `/v1/topics/${seg(topic.name)}`, body);
        Object.assign(topic, saved);
        said(result, `Saved: ${Object.keys(body).join(", ")}.`);
      });
    },
  }, Object.entries(inputs).map(([key, input]) => field(labels[key], input)), save);
  return el("section", { class: "card" }, el("h2", {}, "Settings"), form, result);
}

function produceCard(topic) {
  const result = el("div", { "aria-live": "polite" });
  const key = el("input", { name: "produce-key", autocomplete: "off" });
  const value = el("textarea", { name: "produce-value", rows: "3" });
  const send = el("button", { type: "submit" }, "Produce");
  const form = el("form", {
    class: "stack",
    onsubmit: (event) => {
      event.preventDefault();
      act(result, send, async () => {
        // The batch form carries any key as JSON text (a header could
        // not hold every character).
        const message = key.value ? { key: key.value, value: value.value } : { value: value.value };
        const answer = await api("POST", `/v1/topics/${seg(topic.name)}/messages/batch`, { messages: [message] });
        said(result, `Accepted: message ${answer.ids[0]}.`);
      });
    },
  }, field("Key (optional)", key), field("Value", value), el("div", { class: "buttons" }, send));
  return el("section", { class: "card" }, el("h2", {}, "Produce a message"), form, result);
}

// A card that deletes `name` (at `path`) once its name is typed, then
// goes to `after`.
function deletionCard(heading, buttonLabel, name, path, after, note) {
  const result = el("div", { "aria-live": "polite" });
  const remove = el("button", { type: "submit", class: "danger" }, buttonLabel);
  const [label, input] = typedConfirmation(name, remove);
  const form = el("form", {
    class: "inline",
    onsubmit: (event) => {
      event.preventDefault();
      if (input.value !== name) return;
      act(result, remove, async () => {
        await api("DELETE", path);
        location.hash = after;
      });
    },
  }, label, remove);
  return el("section", { class: "card" }, el("h2", {}, heading), note ? el("p", { class: "muted" }, note) : null, form, result);
}

function deleteCard(topic) {
  return deletionCard("Delete this topic", "Delete topic", topic.name, `/v1/topics/${seg(topic.name)}`, "#/topics",
    "Its messages are gone for good; a topic made again under this name starts empty.");
}

// The redrive form and the tasks' table.
function redriveCard(name, feeding, tasks) {
  const result = el("div", { "aria-live": "polite" });
  const to = el("input", { name: "to", required: true, autocomplete: "off", value: feeding[0] || "" });
  const rate = el("input", { name: "rate_per_s", type: "number", min: "1", max: "1000000", placeholder: "no limit" });
  const most = el("input", { name: "max_messages", type: "number", min: "1", placeholder: "all" });
  const start = el("button", { type: "submit" }, "Start redrive");
  const form = el("form", {
    class: "inline",
    onsubmit: (event) => {
      event.preventDefault();
      act(result, start, async () => {
        const task = await api("POST", `/v1/topics/${seg(name)}/redrive`, { to: to.value, rate_per_s: numberOf(rate), max_messages: numberOf(most) });
        said(result, `Redrive ${task.id} started: it moves messages to ${task.to}.`);
        await redriveTasks(name, tasks);
      });
    },
  }, field("To topic", to), field("Rate (messages/s)", rate), field("At most (messages)", most), start);
  const why = feeding.length
    ? `Dead letters of ${feeding.join(", ")} land here. A redrive moves them back (each is written to the target before it is acked here).`
    : "A redrive moves this topic's messages to another topic (each is written to the target before it is acked here).";
  // A cancel's refusal goes where the next refresh leaves it.
  tasks.result = result;
  return el("section", { class: "card" }, el("h2", {}, "Redrive"), el("p", { class: "muted" }, why), form, result, tasks);
}

async function redriveTasks(name, where) {
  const listed = await api("GET", `/v1/topics/${seg(name)}/redrive`).catch((error) => ({ error }));
  if (listed.error) return showError(listed.error, where);
  const cancel = (task) => button("Cancel", (event) => act(where.result || where, event.target, async () => {
    await api("DELETE", `/v1/topics/${seg(name)}/redrive/${seg(task.id)}`);
    await redriveTasks(name, where);
  }), { "aria-label": `Cancel redrive ${task.id}` });
  put(where, listed.tasks.length === 0 ? el("p", { class: "muted" }, "No redrives.") : table(
    [["Redrive"], ["To"], ["Moved", true], ["Remaining", true], ["Progress"], ["State"], ["Started"], [""]],
    listed.tasks.map((t) => [t.id, t.to, String(t.moved), String(t.remaining),
      el("progress", { max: String(Math.max(1, t.moved + t.remaining)), value: String(t.moved), "aria-label": `Redrive ${t.id}` }),
      t.error ? `${t.state}: ${t.error}` : t.state, when(t.created_at_ms), t.state === "running" ? cancel(t) : ""]),
  ));
}

function browseForm(topic, section) {
  const partition = el("input", { name: "partition", type: "number", min: "0", max: String(topic.partitions - 1), value: String(browsing.partition) });
  const offset = el("input", { name: "offset", type: "number", min: "0", placeholder: "frontier", value: browsing.offset ?? "" });
  const form = el("form", {
    class: "inline",
    onsubmit: (event) => {
      event.preventDefault();
      browsing.partition = Number(partition.value || 0);
      browsing.offset = offset.value === "" ? null : Number(offset.value);
      browse(section);
    },
  }, field("Partition", partition), field("From offset", offset), el("button", { type: "submit" }, "Show"));
  browsing.offsetInput = offset;
  return form;
}

function messageRows(messages) {
  return table(
    [["Partition", true], ["Offset", true], ["Key"], ["Value"], ["Produced"], ["State"], ["Deliveries", true]],
    messages.map((m) => [String(m.partition), String(m.offset), m.key ?? "", valueOf(m), when(m.produced_at_ms), m.state, String(m.delivery_count)]),
  );
}

async function browse(section) {
  const query = new URLSearchParams({ limit: String(BROWSE_PAGE) });
  if (browsing.offset !== null) query.set("offset", String(browsing.offset));
  try {
    const page = await api("GET", `/v1/topics/${seg(browsing.topic)}/partitions/${browsing.partition}/messages?${query}`);
    const first = page.messages.length ? page.messages[0].offset : page.next_offset;
    // The offset field follows the page shown.
    if (browsing.offsetInput && page.messages.length) browsing.offsetInput.value = String(first);
    const go = (offset) => { browsing.offset = offset; browse(section); };
    put(section,
      el("p", { class: "muted" }, `Partition ${browsing.partition}: frontier ${page.frontier}, high watermark ${page.high_watermark}`),
      page.messages.length === 0 ? el("p", { class: "muted" }, "No messages here.") : messageRows(page.messages),
      el("div", { class: "buttons" },
        first > 0 ? button("Previous page", () => go(Math.max(0, first - BROWSE_PAGE))) : null,
        page.next_offset < page.high_watermark ? button("Next page", () => go(page.next_offset)) : null),
    );
  } catch (error) {
    showError(error, section);
  }
}

function searchForm(topic, found) {
  const key = el("input", { name: "key", autocomplete: "off" });
  const contains = el("input", { name: "contains", autocomplete: "off" });
  // What "Search further" goes on with: the search as submitted, not
  // the fields as they are now.
  let cursor = null, wanted = null;
  const run = async (event) => {
    if (event) {
      event.preventDefault();
      cursor = null;
      wanted = { key: key.value, contains: contains.value };
      put(found);
    }
    const query = new URLSearchParams({ limit: "50" });
    if (wanted.key) query.set("key", wanted.key);
    if (wanted.contains) query.set("contains", wanted.contains);
    if (cursor) query.set("cursor", cursor);
    try {
      const answer = await api("GET", `/v1/topics/${seg(topic.name)}/messages?${query}`);
      cursor = answer.cursor;
      found.querySelector("button.more")?.remove();
      found.append(answer.messages.length ? messageRows(answer.messages) : el("p", { class: "muted" }, "No match in this stretch."));
      found.append(cursor ? button("Search further", () => run(), { class: "more" }) : el("p", { class: "muted" }, "Every retained message was searched."));
    } catch (error) {
      showError(error, found);
    }
  };
  return el("form", { class: "inline", onsubmit: run }, field("Key", key), field("Contains", contains), el("button", { type: "submit" }, "Search"));
}

// ------------------------------------------------------------------ users

const ACTIONS = ["produce", "consume", "admin", "cluster"];

function grantsText(grants) {
  return grants.map((g) => `${g.topic}: ${g.actions.join(", ")}`).join("; ") || "none";
}

async function usersPage(view) {
  const list = el("div");
  const result = el("div", { "aria-live": "polite" });
  const name = el("input", { name: "name", required: true, autocomplete: "off" });
  const password = el("input", { name: "password", type: "password", required: true, autocomplete: "new-password" });
  const create = el("button", { type: "submit" }, "Create user");
  const form = el("form", {
    class: "inline",
    onsubmit: (event) => {
      event.preventDefault();
      act(result, create, async () => {
        // PUT also changes a user's password: this form only creates.
        const listed = await api("GET", "/v1/users");
        if (listed.users.some((u) => u.name === name.value)) {
          throw new Error(`A user named ${name.value} exists already; change it on its own page.`);
        }
        await api("PUT", `/v1/users/${seg(name.value)}`, { password: password.value });
        location.hash = `#/users/${seg(name.value)}`;
      });
    },
  }, field("Name", name), field("Password", password), create);
  put(view, el("h1", {}, "Users"), list, el("section", { class: "card" }, el("h2", {}, "Create a user"), form, result));
  return async () => {
    const listed = await api("GET", "/v1/users");
    put(list, table([["User"], ["Grants"], ["Tokens", true]], listed.users.map((u) =>
      [el("a", { href: `#/users/${seg(u.name)}` }, u.name), grantsText(u.grants), String(u.tokens.length)])));
  };
}

async function userPage(view, name) {
  const path = `/v1/users/${seg(name)}`;
  const listed = await api("GET", "/v1/users");
  const user = listed.users.find((u) => u.name === name);
  if (!user) throw new ApiError(404, "not_found", `there is no user ${name}`);
  const tokens = el("div");
  const tokenResult = el("div", { "aria-live": "polite" });
  const refresh = async () => {
    const now = (await api("GET", "/v1/users")).users.find((u) => u.name === name);
    if (!now) return;
    put(tokens, now.tokens.length === 0 ? el("p", { class: "muted" }, "No tokens.") : table([["Token"], ["Created"], [""]],
      now.tokens.map((t) => [t.id, when(t.created_at_ms), button(`Revoke ${t.id}`, (event) => act(tokenResult, event.target, async () => {
        await api("DELETE", `${path}/tokens/${seg(t.id)}`);
        said(tokenResult, `Token ${t.id} revoked.`);
        await refresh();
      }))])));
  };
  const newToken = button("Create a token", (event) => act(tokenResult, event.target, async () => {
    const made = await api("POST", `${path}/tokens`);
    put(tokenResult, el("p", {}, `Token ${made.id}, shown this once (copy it now):`), el("p", { class: "secret" }, made.token));
    await refresh();
  }));
  put(view,
    el("h1", {}, `User ${name}`),
    grantsCard(name, user.grants),
    el("section", { class: "card" }, el("h2", {}, "Tokens"), tokens, el("div", { class: "buttons" }, newToken), tokenResult),
    passwordCard(name),
    deleteUserCard(name),
  );
  return refresh;
}

function grantsCard(name, grants) {
  const result = el("div", { "aria-live": "polite" });
  const rows = el("div");
  const addRow = (grant) => {
    const topic = el("input", { name: "topic", autocomplete: "off", value: grant.topic, "aria-label": "Topic, prefix* or *" });
    const boxes = ACTIONS.map((action) => el("input", { type: "checkbox", name: action, checked: grant.actions.includes(action) }));
    const row = el("div", { class: "inline grant" }, field("Topic (name, prefix* or *)", topic),
      ACTIONS.map((action, i) => el("label", { class: "check" }, boxes[i], action)),
      button("Remove", () => row.remove(), { "aria-label": `Remove the grant on ${grant.topic || "a new topic"}` }));
    row.read = () => ({ topic: topic.value, actions: ACTIONS.filter((_, i) => boxes[i].checked) });
    rows.append(row);
  };
  grants.forEach(addRow);
  const save = el("button", { type: "submit" }, "Save grants");
  const form = el("form", {
    class: "stack",
    onsubmit: (event) => {
      event.preventDefault();
      act(result, save, async () => {
        const wanted = Array.from(rows.children, (row) => row.read()).filter((g) => g.topic !== "" || g.actions.length);
        const saved = await api("PUT", `/v1/users/${seg(name)}/grants`, { grants: wanted });
        said(result, `Saved: ${grantsText(saved.grants || wanted)}.`);
      });
    },
  }, rows, el("div", { class: "buttons" }, button("Add a grant", () => addRow({ topic: "", actions: [] })), save));
  return el("section", { class: "card" }, el("h2", {}, "Grants"), form, result);
}

function passwordCard(name) {
  const result = el("div", { "aria-live": "polite" });
  const password = el("input", { name: "new-password", type: "password", required: true, autocomplete: "new-password" });
  const save = el("button", { type: "submit" }, "Change password");
  const form = el("form", {
    class: "inline",
    onsubmit: (event) => {
      event.preventDefault();
      act(result, save, async () => {
        await api("PUT", `/v1/users/${seg(name)}`, { password: password.value });
        password.value = "";
        said(result, "Password changed.");
      });
    },
  }, field("New password", password), save);
  return el("section", { class: "card" }, el("h2", {}, "Password"), form, result);
}

function deleteUserCard(name) {
  return deletionCard("Delete this user", "Delete user", name, `/v1/users/${seg(name)}`, "#/users", "Its tokens go with it.");
}

// ---------------------------------------------------------------- schemas

async function schemasPage(view) {
  const list = el("div");
  put(view, el("h1", {}, "Schemas"), list, schemaCard(null));
  return async () => {
    const listed = await api("GET", "/v1/schemas");
    put(list, listed.schemas.length === 0 ? el("p", { class: "muted" }, "No schemas.") : table([["Schema"], ["Version", true]],
      listed.schemas.map((s) => [el("a", { href: `#/schemas/${seg(s.name)}` }, s.name), String(s.version)])));
  };
}

async function schemaPage(view, name) {
  const schema = await api("GET", `/v1/schemas/${seg(name)}`);
  put(view,
    el("h1", {}, `Schema ${name}, version ${schema.version}`),
    el("pre", { class: "value" }, JSON.stringify(schema.schema, null, 2)),
    schemaCard(schema),
    deletionCard("Delete this schema", "Delete schema", name, `/v1/schemas/${seg(name)}`, "#/schemas", "A topic that uses it must drop it first."),
  );
  return async () => {};
}

// The form that makes a schema, or its next version.
function schemaCard(schema) {
  const result = el("div", { "aria-live": "polite" });
  const name = el("input", { name: "schema-name", required: true, autocomplete: "off", value: schema ? schema.name : "", readonly: Boolean(schema) });
  const text = el("textarea", { name: "schema", required: true, rows: "8" });
  text.value = schema ? JSON.stringify(schema.schema, null, 2) : '{\n  "type": "object"\n}';
  const save = el("button", { type: "submit" }, schema ? "Save as the next version" : "Create schema");
  const form = el("form", {
    class: "stack",
    onsubmit: (event) => {
      event.preventDefault();
      act(result, save, async () => {
        let document_;
        try { document_ = JSON.parse(text.value); } catch (error) { throw new Error(`The schema is not JSON: ${error.message}`); }
        // PUT also adds a version to a schema that exists: a new one is
        // made only under a new name.
        if (!schema) {
          const listed = await api("GET", "/v1/schemas");
          if (listed.schemas.some((t) => t.name === name.value)) {
            throw new Error(`A schema named ${name.value} exists already; save a new version on its own page.`);
          }
        }
        const saved = await api("PUT", `/v1/schemas/${seg(name.value)}`, document_);
        if (schema) return show();
        location.hash = `#/schemas/${seg(saved.name)}`;
      });
    },
  }, field("Name", name), field("JSON Schema", text), el("div", { class: "buttons" }, save));
  return el("section", { class: "card" }, el("h2", {}, schema ? "A new version" : "Create a schema"), form, result);
}

// ----------------------------------------------------------- navigation

function page() {
  const [, section, name] = (location.hash || "#/cluster").split("/");
  const named = name ? decodeURIComponent(name) : null;
  if (section === "topics") return named ? (view) => topicPage(view, named) : topicsPage;
  if (section === "users") return named ? (view) => userPage(view, named) : usersPage;
  if (section === "schemas") return named ? (view) => schemaPage(view, named) : schemasPage;
  return clusterPage;
}

// Builds the page once (out of sight, so that a page left while it loads
// never replaces the next), then refreshes its numbers every REFRESH_MS
// without touching what the user is typing.
async function show(navigated) {
  clearTimeout(refreshTimer);
  const generation = ++shown;
  notice.hidden = true;
  for (const link of document.querySelectorAll("nav a")) {
    if (location.hash.startsWith(link.getAttribute("href"))) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  const view = el("div", { class: "page" });
  let refresh;
  try {
    refresh = await page()(view);
    if (generation !== shown) return;
    await refresh();
    if (generation !== shown) return;
    put(main, view);
    if (navigated === true) main.focus({ preventScroll: true });
    signedIn();
  } catch (error) {
    if (generation !== shown) return;
    showError(error);
    // A node that could not answer is asked again; a refusal stays shown.
    if (!(error instanceof ApiError) || error.status >= 500) refreshTimer = setTimeout(show, REFRESH_MS);
    return;
  } finally {
    document.getElementById("sign-out").hidden = !sessionStorage.getItem(CREDENTIAL);
    document.getElementById("who").textContent = sessionStorage.getItem(WHO) || "";
  }
  const again = async () => {
    if (generation !== shown) return;
    try {
      await refresh();
      notice.hidden = true;
    } catch (error) {
      if (error instanceof ApiError && error.status === 401) return signIn(error.message);
      put(notice, el("span", { class: "error" }, `Could not refresh: ${errorText(error)}`));
      notice.hidden = false;
    }
    if (generation === shown) refreshTimer = setTimeout(again, REFRESH_MS);
  };
  refreshTimer = setTimeout(again, REFRESH_MS);
}

// Who is signed in is shown once the node took the credential.
function signedIn() {
  const pending = sessionStorage.getItem(PENDING_WHO);
  if (pending === null) return;
  sessionStorage.removeItem(PENDING_WHO);
  sessionStorage.setItem(WHO, pending);
  document.getElementById("who").textContent = pending;
}

function signIn(why) {
  clearTimeout(refreshTimer);
  shown += 1;
  sessionStorage.removeItem(PENDING_WHO);
  sessionStorage.removeItem(WHO);
  document.getElementById("who").textContent = "";
  const dialog = document.getElementById("sign-in");
  document.getElementById("sign-in-why").textContent = why || "";
  put(main, el("p", { class: "muted" }, "Sign in to see this node. ", button("Open the sign-in form", () => signIn(why))));
  if (!dialog.open) dialog.showModal();
}

document.getElementById("sign-in-form").addEventListener("submit", () => {
  const form = document.getElementById("sign-in-form");
  const user = form.user.value, password = form.password.value, token = form.token.value.trim();
  if (token) sessionStorage.setItem(CREDENTIAL, `Bearer ${token}`);
  else sessionStorage.setItem(CREDENTIAL, `Basic ${btoa(unescape(encodeURIComponent(`${user}:${password}`)))}`);
  sessionStorage.setItem(PENDING_WHO, token ? "signed in with a token" : `signed in as ${user}`);
  form.reset();
  show();
});

document.getElementById("sign-out").addEventListener("click", () => {
  sessionStorage.removeItem(CREDENTIAL);
  sessionStorage.removeItem(WHO);
  show();
});

window.addEventListener("hashchange", () => show(true));
show();
