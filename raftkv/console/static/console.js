// The raftkv console: fetches /api/<page> from the node that served it and draws the page.
// No libraries and nothing from outside the node; every value goes in as text, never as HTML.
"use strict";

const PAGE = { "/": "overview" }[location.pathname] || location.pathname.slice(1);
const main = document.getElementById("main");

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k.startsWith("data-")) node.setAttribute(k, v);
    else if (k === "onclick") node.onclick = v;
    else node.setAttribute(k, v);
  }
  for (const c of children.flat()) node.append(c instanceof Node ? c : document.createTextNode(c == null ? "" : String(c)));
  return node;
}

const unknown = () => el("span", { class: "unknown" }, "unknown");
const show = (v, f) => (v === null || v === undefined ? unknown() : f ? f(v) : String(v));
const badge = (kind, text) => el("span", { class: `badge ${kind}-${text}` }, text);
const bytes = (n) => { const u = ["B", "kB", "MB", "GB", "TB"]; let i = 0; while (n >= 1024 && i < 4) { n /= 1024; i++; } return `${n.toFixed(i ? 1 : 0)} ${u[i]}`; };
const duration = (s) => s < 120 ? `${s.toFixed(0)}s` : s < 7200 ? `${(s / 60).toFixed(0)}m` : `${(s / 3600).toFixed(1)}h`;
const rate = (r) => r.toFixed(r < 10 ? 1 : 0);
const time = (at) => new Date(at * 1000).toLocaleTimeString();
const bar = (fraction) => el("span", { class: "bar", "data-fraction": fraction == null ? "" : fraction.toFixed(3) },
  el("span", { style: `width:${Math.round(100 * (fraction || 0))}%` }));

async function api(path) {
  const headers = {};
  const token = sessionStorage.getItem("raftkv-token");
  if (token) headers.Authorization = `Bearer ${token}`;
  const reply = await fetch(`/api/${path}`, { headers, cache: "no-store" });
  const body = await reply.json();
  if (reply.status === 401) { login(body.error); throw new Error(body.error); }
  if (!reply.ok) throw new Error(body.error || `HTTP ${reply.status}`);
  return body;
}

function login(message) {
  const form = document.getElementById("login");
  main.replaceChildren();
  form.hidden = false;
  if (sessionStorage.getItem("raftkv-token")) document.getElementById("login-error").textContent = message;
  form.onsubmit = (e) => { e.preventDefault(); sessionStorage.setItem("raftkv-token", document.getElementById("token").value); location.reload(); };
}

function table(columns, rows, sortable) {
  // columns: [{title, value(row) -> sort key, cell(row) -> node or text, num}]
  const body = el("tbody");
  const draw = (list) => body.replaceChildren(...list.map((r) => el("tr", r.attrs || {},
    columns.map((c) => el("td", { class: c.num ? "num" : "" }, c.cell(r))))));
  let order = { column: null, descending: false };
  const head = el("tr", {}, columns.map((c) => el("th", {
    class: sortable && c.value ? "sortable" : "",
    onclick: sortable && c.value ? () => {
      order = { column: c, descending: order.column === c ? !order.descending : false };
      const sorted = [...rows].sort((a, b) => (c.value(a) > c.value(b) ? 1 : c.value(a) < c.value(b) ? -1 : 0));
      draw(order.descending ? sorted.reverse() : sorted);
    } : null,
  }, c.title)));
  draw(rows);
  return el("table", {}, el("thead", {}, head), body);
}

// -- pages ------------------------------------------------------------------

async function overview() {
  const d = await api("overview");
  const problems = [
    ...d.leaderless.map((p) => el("li", { "data-problem": "leaderless" }, `partition ${p}: no leader`)),
    ...d.under_replicated.map((p) => el("li", { "data-problem": "under-replicated" }, `partition ${p}: under-replicated`)),
    ...d.unknown.map((p) => el("li", { "data-problem": "unknown", class: "unknown" }, `partition ${p}: unknown (no replica answered)`)),
  ];
  const floor = d.rates_complete ? "" : " (nodes that answered)";
  return [
    el("div", { class: "cards" },
      el("div", { class: "card" }, "writes/s" + floor, el("b", { id: "writes" }, rate(d.writes_per_s))),
      el("div", { class: "card" }, "reads/s" + floor, el("b", { id: "reads" }, rate(d.reads_per_s))),
      el("div", { class: "card" }, "partitions × replicas", el("b", {}, `${d.partitions} × ${d.replication}`)),
      el("div", { class: "card" }, "metadata leader", el("b", {}, show(d.meta_leader)))),
    el("h2", {}, "Nodes"),
    table([
      { title: "node", value: (n) => n.id, cell: (n) => el("a", { href: n.console }, n.id) },
      { title: "host", value: (n) => n.host, cell: (n) => n.host },
      { title: "state", value: (n) => n.state, cell: (n) => el("span", { title: `metadata: ${n.recorded_state}` }, badge("state", n.state)) },
      { title: "uptime", num: 1, value: (n) => n.uptime_s || 0, cell: (n) => show(n.uptime_s, duration) },
      { title: "replicas", num: 1, value: (n) => n.replicas || 0, cell: (n) => show(n.replicas) },
      { title: "leaders", num: 1, value: (n) => n.leaders || 0, cell: (n) => show(n.leaders) },
      { title: "disk used", num: 1, value: (n) => n.disk_used_bytes || 0, cell: (n) => show(n.disk_used_bytes, bytes) },
      { title: "RSS", num: 1, value: (n) => n.rss_bytes || 0, cell: (n) => show(n.rss_bytes, bytes) },
      { title: "CPU", num: 1, value: (n) => n.cpu_percent || 0, cell: (n) => show(n.cpu_percent, (c) => `${c.toFixed(0)}%`) },
    ], d.nodes.map((n) => ({ ...n, attrs: { "data-node": n.id, "data-state": n.state } })), true),
    el("h2", {}, "Partitions needing attention"),
    problems.length ? el("ul", { class: "problems" }, problems) : el("p", { id: "healthy" }, "every partition has a leader and its replicas"),
  ];
}

function cell(c) {
  if (c.role === "") return "";
  const parts = [badge("role", c.role)];
  if (c.role === "moving") {
    parts.push(bar(c.fraction), el("small", {}, `${c.bytes == null ? "?" : bytes(c.bytes)} copied, applied ${c.applied == null ? "?" : c.applied}`));
  } else if (c.term !== undefined) {
    parts.push(el("small", {}, `t${c.term} c${c.commit} a${c.applied}` + (c.lag ? ` lag ${c.lag}` : "")));
  }
  if (c.moving_out) parts.push(el("small", {}, "moving out"));
  return el("span", { class: "cell", "data-role": c.role, "data-lag": c.lag == null ? "" : c.lag }, parts);
}

async function placement() {
  const d = await api("placement");
  const columns = [
    { title: "partition", num: 1, value: (r) => r.partition, cell: (r) => el("a", { href: `/partition?p=${r.partition}` }, r.partition) },
    { title: "health", value: (r) => r.health, cell: (r) => badge("health", r.health) },
    { title: "leader", value: (r) => r.leader || "", cell: (r) => show(r.leader) },
    { title: "term", num: 1, value: (r) => r.term || 0, cell: (r) => show(r.term) },
    ...d.nodes.map((n) => ({
      title: d.answered[n] ? n : `${n} (no answer)`,
      value: (r) => ({ leader: 0, voter: 1, moving: 2, missing: 3, unknown: 4, "": 5 })[r.cells[n].role] * 1e12 + (r.cells[n].lag || 0),
      cell: (r) => cell(r.cells[n]),
    })),
  ];
  return [el("p", { class: "muted" }, "Click a heading to sort. t: term, c: commit index, a: applied index, lag: entries behind the leader's commit."),
    table(columns, d.rows.map((r) => ({ ...r, attrs: { "data-partition": r.partition, "data-health": r.health } })), true)];
}

async function partition() {
  const p = new URLSearchParams(location.search).get("p");
  const d = await api(`partition?p=${encodeURIComponent(p || "")}`);
  return [
    el("h2", {}, `Partition ${d.partition}`),
    el("p", {}, "health ", badge("health", d.health), " leader ", show(d.leader), d.move ? ` — moving ${d.move.source} → ${d.move.target} (${d.move.step})` : ""),
    table([{ title: "node", cell: (r) => r.node }, { title: "replica", cell: (r) => cell(r.cell) }],
      Object.entries(d.cells).map(([node, c]) => ({ node, cell: c, attrs: { "data-node": node } }))),
    el("h2", {}, "Recent leader changes"),
    d.leader_changes.length ? table([{ title: "time", cell: (e) => time(e.at) }, { title: "", cell: (e) => e.text }], d.leader_changes)
      : el("p", { class: "muted" }, "none recorded since the nodes started"),
  ];
}

async function learners() {
  const [d, s] = await Promise.all([api("learners"), api("series?window=600")]);
  const out = [];
  if (!d.learners.length) out.push(el("p", { class: "muted" }, "no learners registered"));
  for (const l of d.learners) {
    out.push(el("h2", { "data-learner": l.name, "data-max-lag": l.max_lag == null ? "" : l.max_lag }, `${l.name} — sink ${l.sink}`));
    out.push(table([
      { title: "partition", num: 1, value: (r) => r.p, cell: (r) => r.p },
      { title: "delivered", num: 1, value: (r) => r.delivered, cell: (r) => r.delivered },
      { title: "leader's last entry", num: 1, value: (r) => r.last, cell: (r) => r.last },
      { title: "lag", num: 1, value: (r) => r.lag, cell: (r) => el("span", { "data-lag": r.lag }, r.lag) },
    ], Object.entries(l.partitions).map(([p, c]) => ({ p: +p, ...c, attrs: { "data-partition": p } })), true));
    if (l.unknown.length) out.push(el("p", { class: "unknown" }, `partitions ${l.unknown.join(", ")}: unknown (no leader answered)`));
  }
  out.push(el("h2", {}, `Largest feed lag on ${s.node}, last 10 minutes`), chart(s, "feed_lag", "entries behind"));
  return out;
}

async function moves() {
  const d = await api("moves");
  return [
    el("h2", {}, "Moves in progress"),
    d.under_way.length ? table([
      { title: "group", cell: (m) => m.name }, { title: "from", cell: (m) => m.source || "-" }, { title: "to", cell: (m) => m.target || "-" },
      { title: "step", cell: (m) => m.step },
      { title: "entries", cell: (m) => el("span", {}, bar(m.fraction), ` ${m.applied == null ? "?" : m.applied} / ${m.leader_commit == null ? "?" : m.leader_commit}`) },
      { title: "bytes copied", num: 1, cell: (m) => show(m.bytes, bytes) },
    ], d.under_way.map((m) => ({ ...m, attrs: { "data-move": m.group } }))) : el("p", { id: "no-moves", class: "muted" }, "none"),
    el("h2", {}, "Pending plan (raftkv rebalance --dry-run)"),
    d.plan.length ? table([{ title: "action", cell: (a) => a.action }, { title: "group", cell: (a) => a.group },
      { title: "from", cell: (a) => a.source || "-" }, { title: "to", cell: (a) => a.target || "-" }], d.plan)
      : el("p", { class: "muted" }, d.plan_complete ? "balanced: nothing to do" : "nothing planned from what answered"),
    el("h2", {}, "Recently completed and rolled back"),
    d.recent.length ? table([{ title: "time", cell: (e) => time(e.at) }, { title: "group", cell: (e) => e.subject }, { title: "", cell: (e) => e.text }], d.recent)
      : el("p", { class: "muted" }, "none since the nodes started"),
  ];
}

function chart(s, field, title) {
  const i = s.fields.indexOf(field), t = s.fields.indexOf("at");
  const points = s.rows.filter((r) => r[i] !== null).map((r) => [r[t], r[i]]);
  const w = 420, h = 120, pad = 4;
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("width", w); svg.setAttribute("height", h);
  const max = Math.max(1e-9, ...points.map((p) => p[1]));
  if (points.length > 1) {
    const t0 = points[0][0], t1 = points[points.length - 1][0];
    const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
    line.setAttribute("points", points.map(([x, y]) => `${(pad + (w - 2 * pad) * (x - t0) / Math.max(1, t1 - t0)).toFixed(1)},${(h - pad - (h - 2 * pad) * y / max).toFixed(1)}`).join(" "));
    line.setAttribute("fill", "none"); line.setAttribute("stroke", "#2457c5"); line.setAttribute("stroke-width", "1.5");
    svg.append(line);
  }
  const last = points.length ? points[points.length - 1][1] : null;
  return el("div", { class: "chart", "data-field": field, "data-points": points.length },
    el("div", { class: "title" }, `${title} — now ${last == null ? "–" : last.toFixed(last < 10 ? 2 : 0)}, max ${points.length ? max.toFixed(max < 10 ? 2 : 0) : "–"}`), svg);
}

async function series() {
  const params = new URLSearchParams(location.search);
  const window = params.get("window") || "3600";
  let rows = [];
  const draw = async () => {  // the first call gets the window; each later one only the rows since the last
    const since = rows.length ? `&since=${rows[rows.length - 1][0]}` : "";
    const s = await api(`series?window=${encodeURIComponent(window)}${since}`);
    const oldest = Date.now() / 1000 - Number(window);
    rows = rows.concat(s.rows).filter((r) => r[0] > oldest);
    const all = { ...s, rows };
    return [el("p", { class: "muted" }, `node ${s.node}, sampled every second; live`),
      chart(all, "writes", "writes/s"), chart(all, "reads", "reads/s"), chart(all, "p50_ms", "latency p50 (ms)"),
      chart(all, "p99_ms", "latency p99 (ms)"), chart(all, "feed_lag", "feed lag (entries)"),
      chart(all, "fsyncs", "fsyncs/s"), chart(all, "raft_bytes", "Raft bytes sent/s")];
  };
  setInterval(() => draw().then((nodes) => main.replaceChildren(...nodes)).catch(() => {}), 2000);
  return draw();
}

async function events() {
  const kind = new URLSearchParams(location.search).get("kind") || "";
  const d = await api(`events${kind ? `?kind=${encodeURIComponent(kind)}` : ""}`);
  const kinds = ["", "leader", "node", "move", "learner", "storage"].map((k) =>
    el("a", { href: k ? `/events?kind=${k}` : "/events", class: k === kind ? "active" : "" }, k || "all"));
  const filter = el("p", { class: "filter" }, "show: ", kinds.flatMap((a) => [a, " "]));
  return [filter, d.events.length ? table([
    { title: "time", cell: (e) => time(e.at) }, { title: "kind", cell: (e) => badge("kind", e.kind) },
    { title: "subject", cell: (e) => e.subject }, { title: "", cell: (e) => e.text }, { title: "seen by", cell: (e) => e.node },
  ], d.events.map((e) => ({ ...e, attrs: { "data-kind": e.kind } }))) : el("p", { class: "muted" }, "no events since the nodes started")];
}

const PAGES = { overview, placement, partition, learners, moves, series, events };

async function start() {
  try {
    const who = await api("whoami");
    document.getElementById("who").textContent = `${who.user ? who.user + " @ " : ""}${who.node}`;
    for (const a of document.querySelectorAll("#nav a")) {
      if (!who.pages.includes(a.dataset.page)) a.remove();
      else if (a.dataset.page === PAGE || (PAGE === "partition" && a.dataset.page === "placement")) a.classList.add("active");
    }
    if (!PAGES[PAGE]) throw new Error(`no such page: ${PAGE}`);
    main.replaceChildren(...[await PAGES[PAGE]()].flat());
  } catch (error) {
    if (document.getElementById("login").hidden) main.replaceChildren(el("p", { class: "error", id: "error" }, error.message));
  } finally {
    document.body.dataset.ready = "1";
  }
}

start();
