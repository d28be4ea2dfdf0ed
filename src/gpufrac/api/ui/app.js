// gpufrac dashboard: the agent's own page, plain JavaScript and SVG. It calls this agent's API only
// (its Content-Security-Policy allows nothing else), with the token typed in kept in sessionStorage
// and sent as an Authorization header; no cookie is ever set.
"use strict";

const POLL_MS = 2000; // GPUs, workloads, deployments, events
const HISTORY_MS = 2500; // the plots' new samples (the agent takes one every 5 s)
const WINDOW_S = 900;
const TOKEN_KEY = "gpufrac-token";
const SVG_NS = "http://www.w3.org/2000/svg";
const GIB = 1024;

const state = {
  gpus: [],
  workloads: [],
  deployments: [],
  events: [],
  lastEvent: null,
  history: null, // {times, gpus, instances, workloads, deployments, mig_geometry}
  timer: null,
  historyTimer: null,
};

// -- small DOM helpers (text is always set as text, never parsed as HTML) --------------------------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

function setAttrs(el, attrs) {
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "text") el.textContent = String(v);
    else if (k === "onclick") el.addEventListener("click", v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
}

function append(el, children) {
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

function byId(id) {
  return document.getElementById(id);
}

// -- formatting --------------------------------------------------------------------------------------

function gib(mib) {
  return mib === null || mib === undefined ? "–" : `${(mib / GIB).toFixed(1)} GiB`;
}

function pct(v) {
  return v === null || v === undefined ? "–" : `${Math.round(v)}%`;
}

function clock(t) {
  const d = new Date(t * 1000);
  return d.toLocaleTimeString([], { hour12: false });
}

function fullTime(t) {
  return new Date(t * 1000).toISOString();
}

const hues = new Map(); // a workload keeps its colour for the life of the page

function hue(key) {
  if (!hues.has(key)) hues.set(key, Math.round((hues.size * 137.508 + 200) % 360)); // golden angle
  return hues.get(key);
}

function color(key, light) {
  if (!key) return light ? "#e4e6e8" : "#9aa0a6";
  return `hsl(${hue(key)}, 55%, ${light ? 82 : 42}%)`;
}

function wlKey(a) {
  return a.tenant === null || a.name === null ? null : `${a.tenant}/${a.name}`;
}

// -- the API -----------------------------------------------------------------------------------------

class AuthNeeded extends Error {}

function authRequired() {
  const meta = document.querySelector('meta[name="gpufrac-auth"]');
  return meta !== null && meta.getAttribute("content") === "token";
}

async function api(path) {
  const headers = { Accept: "application/json" };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = `Bearer ${token}`;
  const r = await fetch(path, { headers, cache: "no-store", credentials: "omit" });
  if (r.status === 401) throw new AuthNeeded("the agent did not take this token");
  if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
  return r.json();
}

// Every request answered before the page acts on a failure: a refused token shows the login once,
// with no request of the old token still in flight behind it.
async function allAnswered(requests) {
  const answers = await Promise.allSettled(requests);
  const failed = answers.filter((a) => a.status === "rejected").map((a) => a.reason);
  if (failed.length) throw failed.find((e) => e instanceof AuthNeeded) || failed[0];
  return answers.map((a) => a.value);
}

function setStatus(text, kind) {
  const el = byId("status");
  el.textContent = text;
  el.dataset.state = kind;
}

// -- start, token ------------------------------------------------------------------------------------

function showLogin(message) {
  stopPolling();
  byId("main").hidden = true;
  byId("login").hidden = false;
  byId("forget").hidden = true;
  byId("login-error").textContent = message || "";
  setStatus("waiting for a token", "login");
  byId("token").focus();
}

function showMain() {
  byId("login").hidden = true;
  byId("main").hidden = false;
  byId("forget").hidden = !authRequired();
}

function stopPolling() {
  clearTimeout(state.timer);
  clearTimeout(state.historyTimer);
  state.timer = state.historyTimer = null;
}

function start() {
  byId("token-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const token = byId("token").value.trim();
    if (!token) return;
    sessionStorage.setItem(TOKEN_KEY, token);
    byId("token").value = "";
    begin();
  });
  byId("forget").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    showLogin("");
  });
  byId("logs-close").addEventListener("click", (ev) => {
    ev.preventDefault();
    history.replaceState(null, "", location.pathname);
    closeLogs();
  });
  byId("logs").addEventListener("close", () => {
    if (location.hash.startsWith("#logs/")) history.replaceState(null, "", location.pathname);
  });
  window.addEventListener("hashchange", route);
  if (authRequired() && !sessionStorage.getItem(TOKEN_KEY)) showLogin("");
  else begin();
}

function begin() {
  stopPolling();
  state.events = [];
  state.lastEvent = null;
  state.history = null;
  poll(true);
}

async function poll(first) {
  try {
    const [gpus, workloads, deployments] = await allAnswered([
      api("/api/v1/gpus"),
      api("/api/v1/workloads"),
      api("/api/v1/deployments"),
    ]);
    const after = state.lastEvent === null ? "" : `&after=${state.lastEvent}`;
    const events = await api(`/api/v1/events?limit=200${after}`);
    state.gpus = gpus.gpus;
    state.workloads = workloads.workloads;
    state.deployments = deployments.deployments;
    mergeEvents(events.events);
    if (first) {
      showMain();
      await pollHistory();
      route();
    }
    render();
    setStatus(`live · updated ${clock(Date.now() / 1000)}`, "ok");
  } catch (e) {
    if (e instanceof AuthNeeded) {
      sessionStorage.removeItem(TOKEN_KEY);
      showLogin(authRequired() ? "That token was not accepted." : "The agent asks for a token.");
      return;
    }
    setStatus(`cannot reach the agent (${e.message}); retrying`, "error");
  }
  state.timer = setTimeout(() => poll(first && state.gpus.length === 0), POLL_MS);
}

function mergeEvents(found) {
  const seen = new Set(state.events.map((e) => e.id));
  for (const e of found) if (!seen.has(e.id)) state.events.push(e);
  state.events.sort((a, b) => a.id - b.id);
  state.events = state.events.slice(-200);
  if (state.events.length) state.lastEvent = state.events[state.events.length - 1].id;
}

// -- history -----------------------------------------------------------------------------------------

async function pollHistory() {
  clearTimeout(state.historyTimer);
  try {
    const h0 = state.history;
    const since = h0 && h0.times.length ? `?since=${h0.times[h0.times.length - 1]}` : "";
    const got = await api(`/api/v1/history${since}`);
    state.history = since ? mergeHistory(h0, got) : got;
    renderPlots();
  } catch (e) {
    if (e instanceof AuthNeeded) return; // poll() shows the login
  }
  state.historyTimer = setTimeout(pollHistory, HISTORY_MS);
}

function mergeHistory(old, got) {
  const n = old.times.length;
  const times = old.times.concat(got.times);
  const cut = Math.max(0, times.length - Math.ceil(got.window_s / got.interval_s));
  const out = { ...got, times: times.slice(cut) };
  for (const kind of ["gpus", "instances", "workloads", "deployments"]) {
    const fresh = new Map(got[kind].map((t) => [t.key, t]));
    const merged = [];
    for (const t of old[kind]) {
      const g = fresh.get(t.key);
      fresh.delete(t.key);
      const series = {};
      for (const [m, vals] of Object.entries(t.series)) {
        const add = g ? g.series[m] : got.times.map(() => null);
        series[m] = vals.concat(add).slice(cut);
      }
      const keep = Object.values(series).some((v) => v.some((x) => x !== null));
      if (keep) merged.push({ ...(g || t), series });
    }
    for (const g of fresh.values()) {
      const series = {};
      for (const [m, vals] of Object.entries(g.series)) {
        series[m] = new Array(n).fill(null).concat(vals).slice(cut);
      }
      merged.push({ ...g, series });
    }
    out[kind] = merged;
  }
  return out;
}

// -- rendering ---------------------------------------------------------------------------------------

function render() {
  renderFleet();
  renderWorkloads();
  renderPending();
  renderDeployments();
  renderEvents();
}

function replace(id, ...children) {
  const el = byId(id);
  el.replaceChildren(...children.flat().filter((c) => c));
}

function geometryOf(g) {
  const geo = state.history && state.history.mig_geometry && state.history.mig_geometry[g.uuid];
  if (geo && geo.memory_slots) return geo;
  return null;
}

function slotsOf(g, geo, inst) {
  const p = geo && geo.profiles[inst.profile];
  if (p) return [p.memory_slots, p.compute_slices];
  const slots = geo ? geo.memory_slots : 8;
  const per = g.memory_total_mib / slots;
  const compute = Number.parseInt(inst.profile, 10) || 1;
  return [Math.max(1, Math.round((inst.memory_mib || per) / per)), compute];
}

function renderFleet() {
  const cards = state.gpus.map((g) => gpuCard(g));
  replace("fleet", cards.length ? cards : h("p", { class: "hint", text: "no GPUs" }));
}

function gpuCard(g) {
  const mig = g.mig_mode && g.mig_mode.current === "enabled";
  const lost = g.health !== "ok";
  const cls = ["gpu", mig ? "mig" : "shared", g.cordoned ? "cordoned" : "", lost ? "lost" : ""];
  const allocations = g.allocations || [];
  const modes = [...new Set(allocations.map((a) => a.mode))];
  const head = h(
    "div",
    { class: "gpu-head" },
    h("h3", { text: `GPU ${g.index}` }),
    h("span", { class: "sub", text: `${g.name}${g.node ? ` · ${g.node}` : ""}` }),
    h("span", { class: "badge mode", text: mig ? "MIG" : modes.join(", ") || "idle" }),
    g.cordoned ? h("span", { class: "badge warn", title: g.cordoned, text: "cordoned" }) : null,
    lost ? h("span", { class: "badge bad", text: `unhealthy: ${g.health}` }) : null,
    g.mig_layout_pinned ? h("span", { class: "badge", text: "layout pinned" }) : null,
  );
  const sum = h(
    "div",
    { class: "gpu-sum" },
    h("span", { "data-field": "used", text: `${gib(g.memory_used_mib)} used` }),
    " · ",
    h("span", { "data-field": "reserved", text: `${gib(g.reserved_memory_mib)} reserved` }),
    ` of ${gib(g.memory_total_mib)}`,
    g.reserved_compute_pct ? ` · ${g.reserved_compute_pct}% compute reserved` : "",
    g.utilization_gpu === null ? "" : ` · utilization ${pct(g.utilization_gpu)}`,
    mig && geometryOf(g) ? ` · ${geometryOf(g).memory_slots} memory slots, ${geometryOf(g).compute_slices} compute slices (■ one slice)` : "",
    g.cordoned ? ` · cordoned: ${g.cordoned}` : "",
  );
  const body = lost ? null : mig ? migDrawing(g) : sharedDrawing(g);
  return h(
    "article",
    { class: cls.filter(Boolean).join(" "), "data-gpu": g.uuid, "data-index": g.index },
    head,
    sum,
    body,
    shareList(g, mig),
  );
}

function migDrawing(g) {
  const geo = geometryOf(g);
  const slots = geo ? geo.memory_slots : 8;
  const W = 800;
  const slotW = W / slots;
  const svg = s("svg", {
    viewBox: `0 0 ${W} 112`,
    role: "img",
    "aria-label": `GPU ${g.index}: ${slots} memory slots, MIG instances`,
  });
  for (let i = 0; i < slots; i++) {
    svg.append(
      s("rect", { x: i * slotW + 1, y: 16, width: slotW - 2, height: 92, fill: "#eef0f2", rx: 3 }),
      s("text", { x: i * slotW + slotW / 2, y: 11, "font-size": 10, fill: "#6b6f73", "text-anchor": "middle" }, `slot ${i}`),
    );
  }
  const allocs = g.allocations || [];
  for (const inst of g.instances || []) {
    const [mem, compute] = slotsOf(g, geo, inst);
    const on = allocs.filter((x) => x.mig && x.mig.start === inst.start && x.mig.profile === inst.profile);
    const shares = on.filter((x) => x.mode !== "mig"); // shared inside by MPS or time-slices
    const a = on[0];
    const key = a && !shares.length ? wlKey(a) : null;
    const x = inst.start * slotW + 3;
    const w = mem * slotW - 6;
    const fill = a ? color(key, true) : "#ffffff";
    const stroke = a ? color(key, false) : "#9aa0a6";
    const g1 = s("g", { class: "instance", "data-profile": inst.profile, "data-start": inst.start });
    g1.append(s("rect", { x, y: 19, width: w, height: 86, rx: 4, fill, stroke, "stroke-width": 1.5, "stroke-dasharray": a ? null : "4 3" }));
    const who = shares.length
      ? `${shares.length} sharing (${shares[0].mode}): ${shares.map((x) => wlKey(x) || "another tenant").join(", ")}`
      : a ? (key || "another tenant") : "idle instance";
    g1.append(s("text", { x: x + 6, y: 34, "font-size": 12, "font-weight": 600, fill: "#1d1f21" }, `${inst.profile}@${inst.start}`));
    g1.append(s("text", { x: x + 6, y: 49, "font-size": 11, fill: "#1d1f21", "font-style": key ? null : "italic" }, clip(who, w / 6.5)));
    // compute slices: one square each
    for (let c = 0; c < compute; c++) {
      g1.append(s("rect", { x: x + 6 + c * 14, y: 56, width: 10, height: 10, rx: 1, fill: stroke }));
    }
    // memory used against the instance's memory
    const total = inst.memory_mib || (g.memory_total_mib / slots) * mem;
    const known = on.filter((x) => x.used_memory_mib !== null && x.used_memory_mib !== undefined);
    const used = known.length ? known.reduce((n, x) => n + x.used_memory_mib, 0) : null;
    g1.append(s("rect", { x: x + 6, y: 76, width: w - 12, height: 8, fill: "#ffffff", stroke, "stroke-width": 0.5 }));
    if (used !== null && used !== undefined && total) {
      g1.append(s("rect", { x: x + 6, y: 76, width: Math.min(1, used / total) * (w - 12), height: 8, fill: stroke }));
    }
    const label = used === null || used === undefined ? gib(total) : `${(used / GIB).toFixed(1)}/${gib(total)}`;
    g1.append(s("text", { x: x + 6, y: 98, "font-size": 10, fill: "#1d1f21" }, clip(label, w / 5.5)));
    g1.append(s("title", {}, `${inst.profile} at slot ${inst.start}: ${compute} compute slices, ${mem} memory slots; ${who}`));
    svg.append(g1);
  }
  return svg;
}

function clip(text, n) {
  const max = Math.max(3, Math.floor(n));
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

function sharedDrawing(g) {
  const W = 800;
  const L = 70; // label column
  const bar = W - L - 4;
  const svg = s("svg", { viewBox: `0 0 ${W} 78`, role: "img", "aria-label": `GPU ${g.index}: reserved and used memory and compute` });
  svg.append(
    s("text", { x: 0, y: 22, "font-size": 11, fill: "#6b6f73" }, "memory"),
    s("text", { x: 0, y: 60, "font-size": 11, fill: "#6b6f73" }, "compute"),
    s("rect", { x: L, y: 8, width: bar, height: 22, fill: "#eef0f2", rx: 3 }),
    s("rect", { x: L, y: 46, width: bar, height: 22, fill: "#eef0f2", rx: 3 }),
  );
  const total = g.memory_total_mib || 1;
  let mx = L;
  let cx = L;
  let anyCompute = false;
  for (const a of g.allocations || []) {
    const key = wlKey(a);
    const light = color(key, true);
    const dark = color(key, false);
    const w = (a.memory_mib / total) * bar;
    svg.append(s("rect", { x: mx, y: 8, width: Math.max(1, w - 1), height: 22, fill: light, stroke: dark, "stroke-width": 1 }, s("title", {}, `${key || "another tenant"}: ${gib(a.memory_mib)} reserved`)));
    if (a.used_memory_mib !== null && a.used_memory_mib !== undefined) {
      const u = Math.min(a.used_memory_mib, a.memory_mib) / total * bar;
      svg.append(s("rect", { x: mx, y: 20, width: Math.max(0, u - 1), height: 10, fill: a.used_memory_mib > a.memory_mib ? "#b3261e" : dark }));
    }
    if (w > 60) svg.append(s("text", { x: mx + 4, y: 18, "font-size": 10, fill: "#1d1f21" }, clip(key ? a.name : "other", w / 6)));
    mx += w;
    if (a.compute_pct) {
      anyCompute = true;
      const cw = (a.compute_pct / 100) * bar;
      svg.append(s("rect", { x: cx, y: 46, width: Math.max(1, cw - 1), height: 22, fill: light, stroke: dark, "stroke-width": 1 }, s("title", {}, `${key || "another tenant"}: ${a.compute_pct}% of the SMs (MPS)`)));
      if (a.sm_percent !== null && a.sm_percent !== undefined) {
        const u = (Math.min(a.sm_percent, a.compute_pct) / 100) * bar;
        svg.append(s("rect", { x: cx, y: 58, width: Math.max(0, u - 1), height: 10, fill: dark }));
      }
      if (cw > 40) svg.append(s("text", { x: cx + 4, y: 56, "font-size": 10, fill: "#1d1f21" }, `${a.compute_pct}%`));
      cx += cw;
    }
  }
  if (!anyCompute) {
    const what = (g.allocations || []).length ? "shared by turns (no compute cap)" : "free";
    svg.append(s("text", { x: L + 8, y: 61, "font-size": 11, fill: "#6b6f73" }, what));
  }
  return svg;
}

function shareList(g, mig) {
  const items = (g.allocations || []).map((a) => {
    const key = wlKey(a);
    const where = a.mig ? `${a.mig.profile}@${a.mig.start}${a.mode !== "mig" ? ` ${a.mode}` : ""}` : a.mode;
    const compute = a.compute_pct ? ` · compute ${a.sm_percent === null || a.sm_percent === undefined ? "–" : `${a.sm_percent}%`} / ${a.compute_pct}%` : a.sm_percent !== null && a.sm_percent !== undefined ? ` · SM ${a.sm_percent}%` : "";
    return h(
      "li",
      { "data-workload": key || "", "data-anonymous": key ? null : "true" },
      h("span", { class: "swatch", "data-color": color(key, false) }),
      key
        ? h("span", { class: "who", text: key })
        : h("span", { class: "who anon", text: "another tenant's share" }),
      h("span", { class: "where", text: where }),
      h("span", { class: "phase", text: a.phase }),
      h("span", {
        class: "mem",
        "data-reserved": a.memory_mib,
        text: `memory ${a.used_memory_mib === null || a.used_memory_mib === undefined ? "–" : gib(a.used_memory_mib)} / ${gib(a.memory_mib)}${compute}`,
      }),
    );
  });
  if (!items.length) return h("p", { class: "hint", text: mig ? "no workload on its instances" : "no workload" });
  const ul = h("ul", { class: "shares" }, items);
  // swatch colours are set through the CSSOM (no inline style attributes: the page's CSP)
  for (const sw of ul.querySelectorAll(".swatch")) sw.style.background = sw.dataset.color;
  return ul;
}

// -- tables ------------------------------------------------------------------------------------------

function table(id, headers, rows, empty) {
  const head = h("tr", {}, headers.map((x) => h("th", { text: x })));
  const body = rows.length ? rows : [h("tr", {}, h("td", { class: "empty", colspan: headers.length, text: empty }))];
  replace(id, h("thead", {}, head), h("tbody", {}, body));
}

function gpuIndex(uuid) {
  const g = state.gpus.find((x) => x.uuid === uuid);
  if (!g) return uuid ? uuid.slice(0, 12) : "?";
  // a cluster (GPUs of several nodes): which node's
  return new Set(state.gpus.map((x) => x.node)).size > 1 ? `${g.index} on ${g.node}` : g.index;
}

function whereOf(w) {
  // a finished workload keeps where it ran (its placement's "where")
  const p = w.placement && w.placement.outcome === "completed" ? w.placement.where : w.placement;
  if (!p || !p.gpus || !p.gpus.length) return "–";
  const gpus = p.gpus.map((u) => `GPU ${gpuIndex(u)}`).join(", ");
  if (p.mig) return `${gpus} · ${p.mig.profile}@${p.mig.start}`;
  const res = (w.spec && w.spec.gpu) || {};
  const share = [];
  const alloc = allocationOf(w);
  if (alloc) {
    share.push(gib(alloc.memory_mib));
    if (alloc.compute_pct) share.push(`${alloc.compute_pct}% compute`);
  } else if (res.memory_mib) share.push(gib(res.memory_mib));
  return `${gpus} · ${p.mode}${share.length ? ` · ${share.join(", ")}` : ""}`;
}

function allocationOf(w) {
  for (const g of state.gpus) {
    for (const a of g.allocations || []) if (a.tenant === w.tenant && a.name === w.name) return a;
  }
  return null;
}

function phaseCell(phase) {
  return h("td", { class: `phase phase-${phase}`, text: phase });
}

function renderWorkloads() {
  const rows = state.workloads.map((w) => {
    const key = `${w.tenant}/${w.name}`;
    const paused = w.phase === "paused" || (w.qos && w.qos.paused);
    return h(
      "tr",
      { "data-key": key },
      h("td", { class: "mono", text: key }),
      phaseCell(w.phase),
      h("td", { text: paused ? "paused" : "" }),
      h("td", { class: "restarts", text: w.restarts }),
      h("td", { class: "where", text: whereOf(w) }),
      h("td", { class: "reason", text: w.reason || "" }),
      h("td", {}, h("a", { href: `#logs/${encodeURIComponent(w.tenant)}/${encodeURIComponent(w.name)}`, text: "logs" })),
    );
  });
  table("workloads", ["workload", "phase", "QoS", "restarts", "where", "reason", ""], rows, "no workloads");
}

function pendingSince(key) {
  for (let i = state.events.length - 1; i >= 0; i--) {
    const e = state.events[i];
    if (e.subject === key && e.kind === "pending") return e.at;
  }
  return null;
}

function asks(w) {
  const g = (w.spec && w.spec.gpu) || {};
  const parts = [];
  if (g.count) parts.push(`${g.count} GPU${g.count > 1 ? "s" : ""}`);
  if (g.mig_profile) parts.push(`MIG ${g.mig_profile}`);
  if (g.fraction_milli) parts.push(`${g.fraction_milli / 10}% of a GPU`);
  if (g.memory_mib) parts.push(gib(g.memory_mib));
  if (g.compute_pct) parts.push(`${g.compute_pct}% compute`);
  if (w.spec && w.spec.sharing) parts.push(w.spec.sharing);
  return parts.join(", ") || "–";
}

function renderPending() {
  const now = Date.now() / 1000;
  const rows = state.workloads
    .filter((w) => w.phase === "pending")
    .map((w) => {
      const key = `${w.tenant}/${w.name}`;
      const since = pendingSince(key);
      return h(
        "tr",
        { "data-key": key },
        h("td", { class: "mono", text: key }),
        h("td", { text: w.spec ? w.spec.priority : "" }),
        h("td", { class: "mono", text: asks(w) }),
        h("td", { text: since === null ? "–" : `${Math.round(now - since)}s` }),
        h("td", { class: "reason", text: w.reason || "" }),
      );
    });
  table("pending", ["workload", "priority", "asks for", "waiting", "reason"], rows, "nothing is waiting");
}

function fmtNum(v, digits) {
  return v === null || v === undefined ? "–" : Number(v).toFixed(digits);
}

function renderDeployments() {
  const rows = state.deployments.map((d) => {
    const t = d.traffic || {};
    const replicas = (d.replicas || [])
      .map((r) => `${r.name} ${r.phase}${r.gpus && r.gpus.length ? ` (GPU ${r.gpus.map(gpuIndex).join(",")})` : ""}${r.draining ? " draining" : ""}`)
      .join("; ");
    return h(
      "tr",
      { "data-key": `${d.tenant}/${d.name}` },
      h("td", { class: "mono", text: `${d.tenant}/${d.name}` }),
      h("td", { class: "replicas", text: `${d.replicas_ready} / ${d.replicas_wanted}` }),
      h("td", { text: fmtNum(t.rate, 1) }),
      h("td", { text: fmtNum(t.p50_ms, 1) }),
      h("td", { text: fmtNum(t.p99_ms, 1) }),
      h("td", { text: `${t.in_flight ?? "–"} / ${t.queued ?? "–"}` }),
      h("td", { class: "mono", text: d.url }),
      h("td", { class: "reason", text: replicas }),
    );
  });
  table(
    "deployments",
    ["deployment", "ready / wanted", "req/s", "p50 ms", "p99 ms", "in flight / queued", "url", "replicas"],
    rows,
    "no deployments",
  );
}

function renderEvents() {
  const rows = state.events
    .slice(-100)
    .reverse()
    .map((e) =>
      h(
        "tr",
        { "data-id": e.id },
        h("td", { class: "mono", title: fullTime(e.at), text: clock(e.at) }),
        h("td", { text: e.kind }),
        h("td", { class: "mono", text: e.subject }),
        h("td", { class: "reason", text: e.message }),
      ),
    );
  table("events", ["time", "kind", "subject", "message"], rows, "no events yet");
}

// -- plots -------------------------------------------------------------------------------------------

const PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22"];
const MAX_LINES = 10;

function renderPlots() {
  const hist = state.history;
  if (!hist) return;
  const times = hist.times;
  const gpuName = (t) => (t.node ? `${t.node} GPU ${t.index}` : `GPU ${t.index}`);
  const mib = (v) => (v === null ? null : v / GIB);
  const charts = [
    chart("GPU memory used", "GiB", times, hist.gpus.map((t) => ({ label: gpuName(t), values: t.series.memory_used_mib.map(mib) }))),
    chart("GPU utilization", "%", times, hist.gpus.filter((t) => !t.mig_enabled).map((t) => ({ label: gpuName(t), values: t.series.utilization_gpu })), { max: 100 }),
    chart("MIG instances: memory used", "GiB", times, hist.instances.map((t) => ({ label: `GPU ${gpuIndex(t.gpu)} ${t.profile}@${t.start} ${t.workload}`, values: t.series.memory_used_mib.map(mib) })), { optional: true }),
    chart("Workloads: memory used", "GiB", times, hist.workloads.map((t) => ({ label: t.name ? `${t.tenant}/${t.name}` : t.key, values: t.series.memory_used_mib.map(mib) }))),
    chart("Workloads: SM use", "%", times, hist.workloads.map((t) => ({ label: `${t.tenant}/${t.name}`, values: t.series.sm_percent })), { max: 100 }),
    chart(
      "QoS: share given (solid) vs entitled (dashed)",
      "share",
      times,
      hist.workloads
        .filter((t) => t.series.qos_share.some((v) => v !== null))
        .flatMap((t) => [
          { label: `${t.tenant}/${t.name}`, values: t.series.qos_share },
          { label: `${t.tenant}/${t.name} entitled`, values: t.series.qos_entitled, dashed: true, pair: true },
        ]),
      { max: 1, optional: true },
    ),
    chart("Deployments: requests/s", "req/s", times, hist.deployments.map((t) => ({ label: t.key, values: t.series.rate })), { optional: true }),
    chart(
      "Deployments: latency p50 (dashed) and p99",
      "ms",
      times,
      hist.deployments.flatMap((t) => [
        { label: `${t.key} p99`, values: t.series.p99_ms },
        { label: `${t.key} p50`, values: t.series.p50_ms, dashed: true, pair: true },
      ]),
      { optional: true },
    ),
    chart(
      "Deployments: queued (dashed) and in flight",
      "requests",
      times,
      hist.deployments.flatMap((t) => [
        { label: `${t.key} in flight`, values: t.series.in_flight },
        { label: `${t.key} queued`, values: t.series.queued, dashed: true, pair: true },
      ]),
      { optional: true },
    ),
    chart(
      "Deployments: replicas ready and wanted (dashed)",
      "replicas",
      times,
      hist.deployments.flatMap((t) => [
        { label: `${t.key} ready`, values: t.series.replicas_ready },
        { label: `${t.key} wanted`, values: t.series.replicas_wanted, dashed: true, pair: true },
      ]),
      { optional: true },
    ),
  ];
  replace("plots", charts);
}

function last(values) {
  for (let i = values.length - 1; i >= 0; i--) if (values[i] !== null && values[i] !== undefined) return values[i];
  return null;
}

function chart(title, unit, times, series, opts) {
  const W = 480;
  const H = 170;
  const M = { l: 40, r: 8, t: 8, b: 20 };
  const box = h("div", { class: "plot", "data-plot": title });
  box.append(h("h3", { text: `${title} (${unit})` }));
  let lines = series.filter((x) => x.values && x.values.some((v) => v !== null && v !== undefined));
  if (!lines.length && opts && opts.optional) return null;
  let note = "";
  if (lines.length > MAX_LINES) {
    // the busiest lines (a dashed partner stays with its line)
    const ranked = lines.filter((x) => !x.pair).sort((a, b) => (last(b.values) || 0) - (last(a.values) || 0));
    const keep = new Set(ranked.slice(0, MAX_LINES / 2).map((x) => x.label));
    lines = lines.filter((x) => keep.has(x.label) || (x.pair && [...keep].some((k) => x.label.startsWith(k))));
    note = `the ${keep.size} highest of ${ranked.length}`;
  }
  const now = times.length ? times[times.length - 1] : Date.now() / 1000;
  // the window shown: what was sampled, at least 2 minutes, at most the 15 kept
  const span = times.length ? now - times[0] : 0;
  const win = [120, 300, 600, WINDOW_S].find((w) => w >= span) || WINDOW_S;
  const t0 = now - win;
  let max = opts && opts.max ? opts.max : 0;
  for (const x of lines) for (const v of x.values) if (v !== null && v !== undefined && v > max) max = v;
  if (max <= 0) max = 1;
  const X = (t) => M.l + ((t - t0) / win) * (W - M.l - M.r);
  const Y = (v) => H - M.b - (v / max) * (H - M.t - M.b);
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": title });
  for (const f of [0, 0.5, 1]) {
    const y = Y(max * f);
    svg.append(
      s("line", { x1: M.l, x2: W - M.r, y1: y, y2: y, stroke: "#e3e5e8", "stroke-width": 1 }),
      s("text", { x: M.l - 4, y: y + 3, "font-size": 9, fill: "#6b6f73", "text-anchor": "end" }, axisNum(max * f)),
    );
  }
  const step = win / (win === WINDOW_S ? 3 : 4);
  for (let ago = win; ago >= 0; ago -= step) {
    const x = X(now - ago);
    const label = ago === 0 ? "now" : ago >= 60 ? `-${ago / 60} min` : `-${ago} s`;
    svg.append(s("text", { x, y: H - 6, "font-size": 9, fill: "#6b6f73", "text-anchor": ago === 0 ? "end" : ago === win ? "start" : "middle" }, label));
  }
  const legend = h("ul", { class: "legend" });
  let colorIndex = -1;
  for (const x of lines) {
    if (!x.pair) colorIndex++;
    const c = PALETTE[colorIndex % PALETTE.length];
    let d = "";
    let pen = false;
    const dots = [];
    x.values.forEach((v, i) => {
      if (v === null || v === undefined || times[i] < t0) {
        pen = false;
        return;
      }
      d += `${pen ? "L" : "M"}${X(times[i]).toFixed(1)},${Y(v).toFixed(1)}`;
      if (!pen) dots.push([X(times[i]), Y(v)]);
      pen = true;
    });
    const path = s("path", { d, fill: "none", stroke: c, "stroke-width": 1.6, "stroke-dasharray": x.dashed ? "4 3" : null });
    path.append(s("title", {}, x.label));
    svg.append(path);
    for (const [px, py] of dots) svg.append(s("circle", { cx: px, cy: py, r: 1.8, fill: c }));
    const sw = h("span", { class: "swatch" });
    sw.style.background = c;
    legend.append(h("li", {}, sw, h("span", { text: x.label }), h("span", { class: "last", text: axisNum(last(x.values)) })));
  }
  if (!lines.length) {
    svg.append(s("text", { x: W / 2, y: H / 2, "font-size": 12, fill: "#9aa0a6", "text-anchor": "middle" }, "no data in the last 15 minutes"));
  }
  box.append(svg, legend);
  if (note) box.append(h("p", { class: "note", text: note }));
  return box;
}

function axisNum(v) {
  if (v === null || v === undefined) return "–";
  if (Math.abs(v) >= 100) return String(Math.round(v));
  if (Math.abs(v) >= 10) return v.toFixed(1);
  return v.toFixed(2).replace(/\.?0+$/, "") || "0";
}

// -- logs --------------------------------------------------------------------------------------------

let logsTimer = null;

function route() {
  const m = location.hash.match(/^#logs\/([^/]+)\/([^/]+)$/);
  if (m) openLogs(decodeURIComponent(m[1]), decodeURIComponent(m[2]));
  else closeLogs();
}

async function openLogs(tenant, name) {
  const dlg = byId("logs");
  byId("logs-title").textContent = `logs of ${tenant}/${name} (newest attempt)`;
  if (!dlg.open) dlg.showModal();
  clearTimeout(logsTimer);
  try {
    const got = await api(`/api/v1/workloads/${encodeURIComponent(tenant)}/${encodeURIComponent(name)}/logs?tail=500`);
    const pre = byId("logs-text");
    const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    pre.textContent = got.lines.length ? got.lines.join("\n") : "(no output yet)";
    if (atEnd) pre.scrollTop = pre.scrollHeight;
  } catch (e) {
    byId("logs-text").textContent = `cannot read the logs: ${e.message}`;
  }
  if (dlg.open) logsTimer = setTimeout(() => openLogs(tenant, name), POLL_MS);
}

function closeLogs() {
  clearTimeout(logsTimer);
  const dlg = byId("logs");
  if (dlg.open) dlg.close();
}

document.addEventListener("DOMContentLoaded", start);
