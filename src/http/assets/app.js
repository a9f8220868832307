// changehub dashboard: follows every public channel over the websocket (proto/websocket.md),
// resumes from its cursors after a disconnect, and shows the newest changes and rates.
"use strict";

const MAX_ROWS = 500;
const state = {
  channels: new Map(), // name -> { cursor, head, topic, arrivals: [[ms, count]] }
  rows: [],            // newest first: { seq, channel, change, loc, datetime }
  socket: null,
  retryMs: 500,
};
const $ = (sel) => document.querySelector(sel);

function setState(text, cls) {
  const el = $("#state");
  el.textContent = text;
  el.className = "state " + cls;
}

function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}

function rate(ch) {
  const now = Date.now();
  ch.arrivals = ch.arrivals.filter(([t]) => now - t < 10000);
  return ch.arrivals.reduce((n, [, c]) => n + c, 0) / 10;
}

function renderChannels() {
  const body = $("#channels tbody");
  body.replaceChildren(...[...state.channels].map(([name, ch]) => {
    const tr = document.createElement("tr");
    tr.dataset.channel = name;
    tr.append(cell(name), cell(String(ch.head), "num head"), cell(rate(ch).toFixed(1), "num"), cell(ch.topic, "loc muted"));
    return tr;
  }));
}

function renderChanges() {
  const text = $("#filter").value.trim().toLowerCase();
  const kind = $("#kind").value;
  const shown = state.rows.filter((r) =>
    (!kind || r.change === kind) &&
    (!text || r.loc.toLowerCase().includes(text) || r.channel.includes(text)));
  $("#changes tbody").replaceChildren(...shown.slice(0, 200).map((r) => {
    const tr = document.createElement("tr");
    if (r.note) {
      tr.className = "note";
      const td = cell(r.note);
      td.colSpan = 5;
      tr.append(td);
      return tr;
    }
    tr.dataset.seq = r.seq;
    tr.append(cell(String(r.seq), "num"), cell(r.channel), cell(r.change, r.change), cell(r.loc, "loc"),
      cell(r.datetime, "muted"));
    return tr;
  }));
  $("#shown").textContent = `${Math.min(shown.length, 200)} of ${state.rows.length} kept`;
}

function onFrame(frame) {
  const ch = state.channels.get(frame.channel);
  switch (frame.type) {
    case "notification":
      if (!ch) return;
      ch.cursor = frame.last;
      ch.head = Math.max(ch.head, frame.last);
      ch.arrivals.push([Date.now(), frame.changes.length]);
      for (const c of frame.changes) {
        state.rows.unshift({ seq: c.seq, channel: frame.channel, change: c.change, loc: c.loc, datetime: c.datetime.replace(/\.\d+Z$/, "Z") });
      }
      state.rows.length = Math.min(state.rows.length, MAX_ROWS);
      renderChanges();
      renderChannels();
      break;
    case "caught_up":
      setState("live", "live");
      break;
    case "reset":
      state.rows.unshift({ note: `${frame.channel}: older changes are no longer retained; continuing from seq ${frame.oldest}` });
      break;
    case "error":
      console.warn("hub error", frame);
      break;
  }
}

function connect() {
  const url = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/ws";
  setState("connecting", "connecting");
  const socket = new WebSocket(url);
  state.socket = socket;
  socket.onopen = () => {
    state.retryMs = 500;
    setState("replaying", "replaying");
    for (const [name, ch] of state.channels) {
      socket.send(JSON.stringify({ op: "subscribe", channel: name, since: ch.cursor }));
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

async function loadChannels() {
  const resp = await fetch("/channels");
  const list = await resp.json();
  for (const c of list) {
    if (c.private) continue;
    // Start with the last 50 changes of each channel, then live.
    state.channels.set(c.name, { cursor: Math.max(0, c.published - 50), head: c.last, topic: c.topic, arrivals: [] });
  }
  renderChannels();
}

async function loadSubscriptions() {
  const token = $("#admin-token").value;
  if (!token) return;
  const resp = await fetch("/api/subscriptions", { headers: { Authorization: "Bearer " + token } });
  if (!resp.ok) return;
  const subs = await resp.json();
  $("#subscriptions tbody").replaceChildren(...subs.map((s) => {
    const tr = document.createElement("tr");
    tr.append(cell(s.channel), cell(s.callback, "loc"), cell(String(s.lag), "num"), cell(s.last_success || "—", "muted"),
      cell(s.last_error || "", s.last_error ? "deleted" : ""), cell(String(s.pending ? s.pending.attempts : 0), "num"));
    return tr;
  }));
}

$("#filter").addEventListener("input", renderChanges);
$("#kind").addEventListener("change", renderChanges);
$("#admin-token").value = localStorage.getItem("changehub-admin-token") || "";
$("#admin-token").addEventListener("change", () => {
  localStorage.setItem("changehub-admin-token", $("#admin-token").value);
  loadSubscriptions();
});
setInterval(renderChannels, 1000);
setInterval(loadSubscriptions, 5000);

loadChannels().then(connect, (e) => setState("cannot load channels: " + e, "disconnected"));
loadSubscriptions();
