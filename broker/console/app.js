// Narad's console: a page over the node's own HTTP API, with the user's
// own credentials (kept for this tab only, in sessionStorage; never in a
// URL, a cookie or localStorage). Everything shown comes from the API, and
// every refusal is shown with the API's message. No other origin is used.
"use strict";

const REFRESH_MS = 5000;
const CREDENTIAL = "narad.credential";
const main = document.getElementById("main");
let refreshTimer = null;

// ---------------------------------------------------------------- the API

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

async function api(method, path, body) {
  const headers = {};
  const credential = sessionStorage.getItem(CREDENTIAL);
  if (credential) headers["Authorization"] = credential;
  const init = { method, headers };
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
    if (name === "class") node.className = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
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
  const relative = ago < 60 ? `${ago} s ago` : ago < 3600 ? `${Math.round(ago / 60)} min ago` : `${Math.round(ago / 3600)} h ago`;
  return el("time", { datetime: date.toISOString(), title: date.toISOString() }, `${relative} (${date.toLocaleString()})`);
}

function age(ms) {
  if (!ms) return "0 s";
  return ms < 60000 ? `${Math.round(ms / 1000)} s` : `${Math.round(ms / 60000)} min`;
}

function showError(error, where) {
  const message = error instanceof ApiError ? `${error.status} ${error.code}: ${error.message}` : String(error);
  (where || main).replaceChildren(el("p", { class: "error", role: "alert" }, message));
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

// A small line chart of numbers, oldest first.
function chart(label, values) {
  // One point (a node that just started) is drawn as a flat line.
  if (values.length === 1) values = [values[0], values[0]];
  const highest = Math.max(0, ...values);
  const max = Math.max(1, highest);
  const width = 360;
  const step = values.length > 1 ? width / (values.length - 1) : width;
  const points = values.map((v, i) => `${(i * step).toFixed(1)},${(60 - (v / max) * 56).toFixed(1)}`).join(" ");
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("class", "chart");
  svg.setAttribute("viewBox", `0 0 ${width} 60`);
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", `${label}: latest ${values[values.length - 1] || 0}, highest ${highest}`);
  const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  line.setAttribute("points", points);
  svg.append(line);
  return el("figure", {}, el("figcaption", { class: "muted" }, `${label} (latest ${values[values.length - 1] || 0}, highest ${highest})`), svg);
}

// ------------------------------------------------------------------ views

async function clusterView() {
  const cluster = await api("GET", "/v1/cluster");
  const moves = await api("GET", "/v1/cluster/moves").catch(() => ({ moves: [] }));
  main.replaceChildren(
    el("h1", {}, "Cluster"),
    el("p", {}, `Cluster ${cluster.cluster_id || "-"}, leader node ${cluster.leader ?? "-"}, term ${cluster.term ?? "-"}`),
    table(
      [["Node"], ["Address"], ["State"], ["Partitions", true]],
      cluster.nodes.map((n) => [String(n.id), n.addr, n.state, String(n.partitions)]),
    ),
    el("h2", {}, "Moves"),
    moves.moves.length === 0
      ? el("p", { class: "muted" }, "No moves.")
      : table(
        [["Topic"], ["Partition", true], ["From", true], ["To", true], ["State"], ["Copied", true], ["Expected end"]],
        moves.moves.map((m) => [m.topic, String(m.partition), String(m.from), String(m.to), m.state,
          m.total_bytes ? `${Math.round((100 * m.copied_bytes) / m.total_bytes)} %` : "-", when(m.expected_end_ms)]),
      ),
  );
}

async function topicsView() {
  const listed = await api("GET", "/v1/topics");
  const rows = [];
  for (const topic of listed.topics) {
    let available = "-", inFlight = "-", oldest = "-";
    try {
      const detail = await api("GET", `/v1/topics/${seg(topic.name)}`);
      const stats = detail.partition_stats || [];
      available = String(stats.reduce((s, p) => s + p.available, 0));
      inFlight = String(stats.reduce((s, p) => s + p.in_flight, 0));
      oldest = age(Math.max(0, ...stats.map((p) => p.oldest_unacked_age_ms)));
    } catch (error) {
      available = error instanceof ApiError ? `${error.status} ${error.code}` : "?";
    }
    rows.push([el("a", { href: `#/topics/${seg(topic.name)}` }, topic.name), String(topic.partitions), available, inFlight, oldest]);
  }
  main.replaceChildren(
    el("h1", {}, "Topics"),
    rows.length === 0 ? el("p", { class: "muted" }, "No topics you may see.") : table(
      [["Topic"], ["Partitions", true], ["Available", true], ["In flight", true], ["Oldest unacked", true]], rows),
  );
}

// The browser's place in the topic shown: partition and offset.
const browsing = { topic: null, partition: 0, offset: null };

async function topicView(name) {
  if (browsing.topic !== name) Object.assign(browsing, { topic: name, partition: 0, offset: null });
  const topic = await api("GET", `/v1/topics/${seg(name)}`);
  const rates = await api("GET", `/v1/topics/${seg(name)}/rates`).catch(() => ({ points: [] }));
  const points = rates.points || [];
  const browser = el("section", { "aria-label": "Messages" });
  const found = el("section", { "aria-label": "Search results" });
  main.replaceChildren(
    el("h1", {}, `Topic ${topic.name}`),
    el("p", { class: "muted" }, `${topic.partitions} partitions, visibility timeout ${topic.visibility_timeout_ms} ms, retention ${topic.retention_ms} ms, max deliveries ${topic.max_deliveries || "unlimited"}${topic.dead_letter_topic ? `, dead letters to ${topic.dead_letter_topic}` : ""}`),
    el("h2", {}, "Partitions"),
    table(
      [["Partition", true], ["Owner", true], ["High watermark", true], ["Frontier", true], ["Available", true], ["In flight", true], ["Oldest unacked", true]],
      (topic.partition_stats || []).map((p) => [String(p.partition), String(p.owner), String(p.high_watermark), String(p.frontier), String(p.available), String(p.in_flight), age(p.oldest_unacked_age_ms)]),
    ),
    el("h2", {}, "Last 15 minutes"),
    chart("Produced per 5 s", points.map((p) => p.produced)),
    chart("Acked per 5 s", points.map((p) => p.acked)),
    chart("Backlog (available + in flight)", points.map((p) => p.available + p.in_flight)),
    el("h2", {}, "Messages"),
    browseForm(topic),
    browser,
    el("h2", {}, "Search"),
    searchForm(topic, found),
    found,
  );
  await browse(browser);
}

function browseForm(topic) {
  const partition = el("input", { name: "partition", type: "number", min: "0", max: String(topic.partitions - 1), value: String(browsing.partition) });
  const offset = el("input", { name: "offset", type: "number", min: "0", placeholder: "frontier", value: browsing.offset ?? "" });
  return el("form", {
    class: "inline",
    onsubmit: (event) => {
      event.preventDefault();
      browsing.partition = Number(partition.value || 0);
      browsing.offset = offset.value === "" ? null : Number(offset.value);
      browse(document.querySelector('section[aria-label="Messages"]'));
    },
  }, el("label", {}, "Partition", partition), el("label", {}, "From offset", offset), el("button", { type: "submit" }, "Show"));
}

function messageRows(messages) {
  return table(
    [["Partition", true], ["Offset", true], ["Key"], ["Value"], ["Produced"], ["State"], ["Deliveries", true]],
    messages.map((m) => [String(m.partition), String(m.offset), m.key ?? "", valueOf(m), when(m.produced_at_ms), m.state, String(m.delivery_count)]),
  );
}

async function browse(section) {
  const query = new URLSearchParams({ limit: "20" });
  if (browsing.offset !== null) query.set("offset", String(browsing.offset));
  try {
    const page = await api("GET", `/v1/topics/${seg(browsing.topic)}/partitions/${browsing.partition}/messages?${query}`);
    const next = el("button", { type: "button", onclick: () => { browsing.offset = page.next_offset; browse(section); } }, "Next page");
    section.replaceChildren(...[
      el("p", { class: "muted" }, `Partition ${browsing.partition}: frontier ${page.frontier}, high watermark ${page.high_watermark}`),
      page.messages.length === 0 ? el("p", { class: "muted" }, "No messages here.") : messageRows(page.messages),
      page.next_offset < page.high_watermark ? next : null,
    ].filter(Boolean));
  } catch (error) {
    showError(error, section);
  }
}

function searchForm(topic, found) {
  const key = el("input", { name: "key" });
  const contains = el("input", { name: "contains" });
  let cursor = null;
  const run = async (event) => {
    if (event) { event.preventDefault(); cursor = null; found.replaceChildren(); }
    const query = new URLSearchParams({ limit: "50" });
    if (key.value) query.set("key", key.value);
    if (contains.value) query.set("contains", contains.value);
    if (cursor) query.set("cursor", cursor);
    try {
      const answer = await api("GET", `/v1/topics/${seg(topic.name)}/messages?${query}`);
      cursor = answer.cursor;
      found.querySelector("button.more")?.remove();
      found.append(answer.messages.length ? messageRows(answer.messages) : el("p", { class: "muted" }, "No match in this stretch."));
      found.append(cursor ? el("button", { type: "button", class: "more", onclick: () => run() }, "Search further") : el("p", { class: "muted" }, "Every retained message was searched."));
    } catch (error) {
      showError(error, found);
    }
  };
  return el("form", { class: "inline", onsubmit: run },
    el("label", {}, "Key", key), el("label", {}, "Contains", contains), el("button", { type: "submit" }, "Search"));
}

// ----------------------------------------------------------- navigation

async function show() {
  clearTimeout(refreshTimer);
  const hash = location.hash || "#/cluster";
  const [, section, name] = hash.split("/");
  try {
    if (section === "topics" && name) await topicView(decodeURIComponent(name));
    else if (section === "topics") await topicsView();
    else await clusterView();
    document.getElementById("sign-out").hidden = !sessionStorage.getItem(CREDENTIAL);
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) return signIn(error.message);
    showError(error);
  }
  // Numbers refresh while the page is open; the topic page keeps the
  // browser and the search where they are.
  if (!(section === "topics" && name)) refreshTimer = setTimeout(show, REFRESH_MS);
}

function signIn(why) {
  const dialog = document.getElementById("sign-in");
  document.getElementById("sign-in-why").textContent = why || "";
  main.replaceChildren(el("p", { class: "muted" }, "Sign in to see this node."));
  if (!dialog.open) dialog.showModal();
}

document.getElementById("sign-in-form").addEventListener("submit", () => {
  const form = document.getElementById("sign-in-form");
  const user = form.user.value, password = form.password.value, token = form.token.value.trim();
  if (token) sessionStorage.setItem(CREDENTIAL, `Bearer ${token}`);
  else sessionStorage.setItem(CREDENTIAL, `Basic ${btoa(unescape(encodeURIComponent(`${user}:${password}`)))}`);
  form.reset();
  document.getElementById("who").textContent = token ? "signed in with a token" : `signed in as ${user}`;
  show();
});

document.getElementById("sign-out").addEventListener("click", () => {
  sessionStorage.removeItem(CREDENTIAL);
  document.getElementById("who").textContent = "";
  show();
});

window.addEventListener("hashchange", show);
show();
