// changehub dashboard. Follows every public channel over the websocket (proto/websocket.md)
// for the table of newest changes, resuming from its cursors after a disconnect. Rates are the
// hub's own counts: `GET /channels` (read every 2 s) gives each channel's changes published
// and notifications delivered per 10-second step of the last 10 minutes, never rows replayed
// into the table. With an admin token, `GET /api/subscriptions` gives each subscription's
// health. `#channel=NAME` is the view of one channel.
"use strict";

const MAX_ROWS = 500;
const SHOWN_ROWS = 200;
const POLL_MS = 2000;
const HEALTH_ORDER = { failing: 3, given_up: 2, retrying: 1, healthy: 0 };
const TYPES = ["created", "updated", "deleted"];
const SVG = "http://www.w3.org/2000/svg";

const state = {
  // name -> { info (from /channels), cursor, head, live, card }
  channels: new Map(),
  rows: [], // newest first: { seq, channel, change, loc, datetime } or { note }
  paused: false,
  missed: 0, // changes that arrived while paused
  selected: null,
  subs: [],
  socket: null,
  retryMs: 500,
};
const $ = (sel) => document.querySelector(sel);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k.startsWith("data-")) node.setAttribute(k, v);
    else node[k] = v;
  }
  node.append(...children);
  return node;
}

function svg(tag, attrs = {}) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

function cell(text, cls) {
  return el("td", cls ? { class: cls } : {}, text);
}

function setState(text, cls) {
  $("#state").textContent = text;
  $("#state").className = "state " + cls;
}

function ago(iso) {
  if (!iso) return "never";
  const s = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
  if (s < 90) return `${s} s ago`;
  if (s < 5400) return `${Math.round(s / 60)} min ago`;
  if (s < 172800) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86400)} days ago`;
}

function duration(s) {
  if (s < 120) return `${s} s`;
  if (s < 7200) return `${Math.round(s / 60)} min`;
  if (s < 172800) return `${Math.round(s / 3600)} h`;
  return `${Math.round(s / 86400)} days`;
}

const num = (n) => n.toLocaleString("en");
const fmt = (v) => (v >= 100 ? v.toFixed(0) : v.toFixed(1));

// ---- rates, from the hub's counts per step ----

// For changes ("last") and deliveries: the rate of each full step, at its end, in seconds
// before now; the current rate (the current step with the one before it); the peak; the total.
function rates(ch) {
  const r = ch.info.rates;
  const out = {};
  for (const [key, counts] of [["last", r.changes], ["delivered", r.deliveries]]) {
    const n = counts.length;
    const points = counts.slice(0, n - 1).map((c, i) => [-r.elapsed - (n - 2 - i) * r.step, c / r.step]);
    const now = (counts[n - 2] + counts[n - 1]) / (r.step + r.elapsed);
    points.push([0, now]);
    out[key] = { points, now, peak: Math.max(...points.map(([, v]) => v)), total: counts.reduce((a, b) => a + b, 0) };
  }
  return out;
}

// The hub's own counts by type over its 10-minute window.
function typeCounts(ch) {
  const types = (ch.info.rates && ch.info.rates.types) || {};
  return Object.fromEntries(TYPES.map((k) => [k, types[k] || 0]));
}

// ---- the channel table, charts and the channel view ----

function visible(name) {
  return !state.selected || state.selected === name;
}

function channelButton(name) {
  const b = el("button", { type: "button", class: "link", "data-open": name }, name);
  b.addEventListener("click", () => { location.hash = "channel=" + encodeURIComponent(name); });
  return b;
}

function renderChannels() {
  $("#channels tbody").replaceChildren(...[...state.channels].map(([name, ch]) => {
    const r = rates(ch);
    const tr = el("tr", { "data-channel": name });
    if (state.selected === name) tr.setAttribute("aria-current", "true");
    tr.append(el("td", {}, channelButton(name)), cell(String(ch.head), "num head"),
      cell(fmt(r.last.now), "num"), cell(fmt(r.delivered.now), "num"), cell(String(ch.info.subscribers), "num wide-only"),
      cell(ch.info.topic, "loc muted wide-only"));
    return tr;
  }));
}

function makeCard(name) {
  const legend = (key, label) => el("span", { class: "series " + key },
    `${label} `, el("b", { "data-now": key }, "0.0"), " now · peak ", el("b", { "data-peak": key }, "0.0"));
  const chart = svg("svg", { viewBox: "0 0 600 120", preserveAspectRatio: "none", role: "img" });
  for (const y of [0, 60, 120]) chart.append(svg("line", { x1: 0, x2: 600, y1: y, y2: y, class: "grid" }));
  chart.append(svg("polygon", { class: "area", points: "" }), svg("polyline", { class: "last", points: "" }), svg("polyline", { class: "delivered", points: "" }));
  const card = el("figure", { class: "chart", "data-channel": name },
    el("figcaption", {}, channelButton(name)),
    el("div", { class: "legend" }, legend("last", "changes/s"), legend("delivered", "deliveries/s")),
    el("p", { class: "totals muted", "data-total": "" }),
    chart,
    el("div", { class: "axis muted" }, el("span", {}, "−10 min"), el("span", { "data-max": "" }), el("span", {}, "now")),
    el("p", { class: "types" }));
  return card;
}

function renderCharts() {
  const cards = [];
  for (const [name, ch] of state.channels) {
    if (!visible(name)) continue;
    ch.card = ch.card || makeCard(name);
    const r = rates(ch);
    const max = Math.max(1, r.last.peak, r.delivered.peak);
    for (const key of ["last", "delivered"]) {
      // 600 units for 600 s: x is seconds since 10 minutes ago.
      const points = r[key].points.map(([t, v]) =>
        `${(600 + t).toFixed(1)},${(120 - (v / max) * 116).toFixed(1)}`);
      ch.card.querySelector("polyline." + key).setAttribute("points", points.join(" "));
      if (key === "last" && points.length) {
        // The changes line's area, down to the axis.
        const [first, last] = [points[0], points[points.length - 1]].map((p) => p.split(",")[0]);
        ch.card.querySelector("polygon.area").setAttribute("points", `${first},120 ${points.join(" ")} ${last},120`);
      }
      ch.card.querySelector(`[data-now="${key}"]`).textContent = fmt(r[key].now);
      ch.card.querySelector(`[data-peak="${key}"]`).textContent = fmt(r[key].peak);
    }
    ch.card.querySelector("[data-max]").textContent = `top: ${fmt(max)}/s`;
    ch.card.querySelector("[data-total]").textContent =
      `${num(r.last.total)} changes, ${num(r.delivered.total)} deliveries in 10 min`;
    ch.card.querySelector("svg").setAttribute("aria-label",
      `${name}: ${fmt(r.last.now)} changes/s now, peak ${fmt(r.last.peak)}; ${fmt(r.delivered.now)} deliveries/s now, peak ${fmt(r.delivered.peak)}`);
    const counts = typeCounts(ch);
    ch.card.querySelector(".types").replaceChildren(...TYPES.flatMap((k, i) =>
      [i ? " · " : "", el("span", { class: k, "data-type": k }, `${k} ${counts[k]}`)]));
    cards.push(ch.card);
  }
  $("#charts").replaceChildren(...cards);
}

function renderDetail() {
  const section = $("#detail");
  const ch = state.selected && state.channels.get(state.selected);
  section.hidden = !ch;
  if (!ch) return;
  const info = ch.info;
  const ret = info.retention;
  const facts = {
    topic: info.topic,
    head: String(ch.head),
    oldest: String(info.oldest),
    epoch: info.epoch,
    retention: `the newest ${num(ret.retain_changes)} changes` + (ret.retain_for ? `, at most ${duration(ret.retain_for)} old` : "") +
      `; a Change List is archived every ${num(ret.archive_every)} changes`,
    subscribers: String(info.subscribers),
  };
  $("#detail-title").textContent = `Channel ${state.selected}`;
  for (const [k, v] of Object.entries(facts)) section.querySelector(`[data-fact="${k}"]`).textContent = v;
  for (const a of section.querySelectorAll("[data-link]")) {
    const href = info[a.dataset.link];
    a.hidden = !href;
    if (href) a.href = href;
  }
}

function select() {
  const m = /^#channel=(.+)$/.exec(location.hash);
  state.selected = m ? decodeURIComponent(m[1]) : null;
  renderChannels();
  renderDetail();
  renderCharts();
  renderChanges(true);
  renderSubs();
}

// ---- the change table ----

function renderChanges(force) {
  if (state.paused && !force) {
    $("#pending-count").textContent = String(state.missed);
    return;
  }
  const text = $("#filter").value.trim().toLowerCase();
  const kind = $("#kind").value;
  const shown = state.rows.filter((r) => r.note ? visible(r.channel) :
    visible(r.channel) && (!kind || r.change === kind) &&
    (!text || r.loc.toLowerCase().includes(text) || r.channel.includes(text)));
  $("#changes tbody").replaceChildren(...shown.slice(0, SHOWN_ROWS).map((r) => {
    if (r.note) return el("tr", { class: "note" }, el("td", { colSpan: 5 }, r.note));
    const tr = el("tr", { "data-seq": r.seq });
    tr.append(cell(String(r.seq), "num"), cell(r.channel), cell(r.change, r.change), cell(r.loc, "loc"),
      cell(r.datetime, "muted wide-only"));
    return tr;
  }));
  $("#shown").textContent = `${Math.min(shown.length, SHOWN_ROWS)} of ${state.rows.length} kept`;
}

function setPaused(paused) {
  state.paused = paused;
  $("#paused").hidden = !paused;
  if (!paused) {
    state.missed = 0;
    renderChanges();
  } else {
    $("#pending-count").textContent = String(state.missed);
  }
}

// ---- the websocket ----

function onFrame(frame) {
  const ch = state.channels.get(frame.channel);
  if (!ch) return;
  switch (frame.type) {
    case "notification":
      ch.cursor = frame.last;
      ch.head = Math.max(ch.head, frame.last);
      for (const c of frame.changes) {
        state.rows.unshift({ seq: c.seq, channel: frame.channel, change: c.change, loc: c.loc, datetime: c.datetime.replace(/\.\d+Z$/, "Z") });
      }
      state.rows.length = Math.min(state.rows.length, MAX_ROWS);
      if (state.paused) state.missed += frame.changes.length;
      renderChanges();
      renderChannels();
      renderDetail();
      break;
    case "caught_up":
      ch.live = true;
      if ([...state.channels.values()].every((c) => c.live)) setState("live", "live");
      break;
    case "reset":
      state.rows.unshift({ channel: frame.channel, note: `${frame.channel}: older changes are no longer retained; continuing from seq ${frame.oldest}` });
      renderChanges();
      break;
    case "error":
      console.warn("hub error", frame);
      break;
  }
}

function subscribe(name, ch) {
  if (state.socket && state.socket.readyState === WebSocket.OPEN) {
    state.socket.send(JSON.stringify({ op: "subscribe", channel: name, since: ch.cursor }));
  }
}

function connect() {
  const url = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/ws";
  setState("connecting", "connecting");
  const socket = new WebSocket(url);
  state.socket = socket;
  socket.onopen = () => {
    state.retryMs = 500;
    setState(state.channels.size ? "replaying" : "live", state.channels.size ? "replaying" : "live");
    for (const [name, ch] of state.channels) {
      ch.live = false;
      subscribe(name, ch);
    }
  };
  socket.onmessage = (ev) => onFrame(JSON.parse(ev.data));
  socket.onclose = (ev) => {
    const wait = state.retryMs;
    state.retryMs = Math.min(state.retryMs * 2, 10000);
    setState(`disconnected (${ev.code}${ev.reason ? ": " + ev.reason : ""}); retrying in ${(wait / 1000).toFixed(1)} s`, "disconnected");
    setTimeout(connect, wait);
  };
}

// ---- reading the channels ----

async function poll() {
  const resp = await fetch("/channels");
  if (!resp.ok) throw new Error(`GET /channels: ${resp.status}`);
  const list = await resp.json();
  for (const info of list) {
    if (info.private) continue;
    let ch = state.channels.get(info.name);
    if (!ch) {
      // Start the table with the last 50 changes of each channel, then live.
      ch = { info, cursor: Math.max(0, info.published - 50), head: info.last, live: false };
      state.channels.set(info.name, ch);
      subscribe(info.name, ch);
    }
    ch.info = info;
    ch.head = Math.max(ch.head, info.last);
  }
  renderChannels();
  renderCharts();
  renderDetail();
}

// ---- subscriptions ----

function setSubsMessage(text, cls) {
  $("#subs-message").textContent = text;
  $("#subs-message").className = cls;
}

async function loadSubscriptions() {
  const token = $("#admin-token").value;
  if (!token) {
    state.subs = [];
    renderSubs();
    setSubsMessage("Callback health needs the admin token.", "muted");
    return;
  }
  let resp;
  try {
    resp = await fetch("/api/subscriptions", { headers: { Authorization: "Bearer " + token } });
  } catch (e) {
    setSubsMessage(`Cannot reach the hub: ${e.message}`, "bad");
    return;
  }
  if (!resp.ok) {
    state.subs = [];
    renderSubs();
    const why = resp.status === 401 || resp.status === 403
      ? "Wrong admin token: the hub refused it. Check the --admin-token the hub was started with."
      : resp.status === 404
        ? "The admin API is disabled on this hub (start it with --admin-token)."
        : `The hub answered ${resp.status} to GET /api/subscriptions.`;
    setSubsMessage(why, "bad");
    return;
  }
  state.subs = await resp.json();
  const counts = {};
  for (const s of state.subs) counts[s.health] = (counts[s.health] || 0) + 1;
  const summary = Object.entries(counts).sort(([a], [b]) => HEALTH_ORDER[b] - HEALTH_ORDER[a])
    .map(([h, n]) => `${n} ${h.replace("_", " ")}`).join(", ");
  setSubsMessage(`${state.subs.length} subscriptions${summary ? ": " + summary : ""} (updated ${new Date().toLocaleTimeString()})`, "muted");
  renderSubs();
}

function renderSubs() {
  const subs = state.subs.filter((s) => visible(s.channel)).sort((a, b) =>
    (HEALTH_ORDER[b.health] || 0) - (HEALTH_ORDER[a.health] || 0) || b.lag - a.lag ||
    a.channel.localeCompare(b.channel) || a.callback.localeCompare(b.callback));
  $("#subscriptions tbody").replaceChildren(...subs.map((s) => {
    const tr = el("tr", { class: "health-" + s.health, "data-health": s.health, "data-callback": s.callback });
    const attempts = s.pending ? s.pending.attempts : s.pending_content ? s.pending_content.attempts || 0 : 0;
    const last = el("td", { class: "muted", title: s.last_success || "" }, ago(s.last_success));
    tr.append(el("td", {}, el("span", { class: "badge" }, s.health.replace("_", " "))), cell(s.channel),
      cell(s.callback, "loc"), cell(String(s.lag), "num"), cell(duration(s.lag_seconds || 0), "num"), last,
      s.last_error ? cell(s.last_error, "loc error") : cell("—", "muted"), cell(String(attempts), "num"));
    // Labels for the narrow layout, where each row is a card.
    const heads = document.querySelectorAll("#subscriptions thead th");
    [...tr.children].forEach((td, i) => td.setAttribute("data-label", heads[i].textContent));
    return tr;
  }));
}

// ---- wiring ----

$("#filter").addEventListener("input", () => renderChanges(true));
$("#kind").addEventListener("change", () => renderChanges(true));
$("#changes-scroll").addEventListener("scroll", (ev) => {
  const paused = ev.target.scrollTop > 2;
  if (paused !== state.paused) setPaused(paused);
});
$("#resume").addEventListener("click", () => {
  $("#changes-scroll").scrollTop = 0;
  setPaused(false);
});
$("#all-channels").addEventListener("click", () => { location.hash = ""; });
window.addEventListener("hashchange", select);
$("#admin-token").value = localStorage.getItem("changehub-admin-token") || "";
$("#token-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  localStorage.setItem("changehub-admin-token", $("#admin-token").value);
  loadSubscriptions();
});

poll().then(() => {
  select();
  connect();
  setInterval(() => poll().catch((e) => console.warn(e)), POLL_MS);
}, (e) => setState("cannot load channels: " + e, "disconnected"));
setInterval(loadSubscriptions, 3000);
loadSubscriptions();
