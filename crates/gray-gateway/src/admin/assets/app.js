// The gray admin page: reads the admin API of the address it was served from, draws it,
// and sends the rollout commands. No build step, no other host: see the gateway's docs,
// "The admin page".
"use strict";

const TOKEN_KEY = "gray-admin-token";
const PALETTE = ["#2563eb", "#16a34a", "#dc2626", "#d97706", "#7c3aed", "#0891b2", "#be185d", "#4b5563"];
const STREAM_NAMES = {
  errors: "errors",
  latency_p99: "slower than baseline's p99",
  latency_p50: "slower than baseline's p50",
  shadow_mismatch: "shadow: mismatches",
  shadow_slow: "shadow: slower answers",
};

// What the page knows, for the tests and for anyone debugging in the console.
const gray = (window.gray = { charts: {}, rollouts: {}, services: {}, cspViolations: [], polls: 0 });
document.addEventListener("securitypolicyviolation", (e) => {
  gray.cspViolations.push(`${e.violatedDirective} ${e.blockedURI}`);
});

// === the API ===

class Unauthorized extends Error {}

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

async function api(path, options = {}) {
  const headers = Object.assign({}, options.headers || {});
  const t = token();
  if (t) headers["Authorization"] = `Bearer ${t}`;
  const response = await fetch(path, Object.assign({}, options, { headers, cache: "no-store" }));
  let body = null;
  const text = await response.text();
  try {
    body = text ? JSON.parse(text) : null;
  } catch (_) {
    body = { error: text };
  }
  if (response.status === 401) {
    askToken(body && body.error);
    throw new Unauthorized((body && body.error) || "401");
  }
  if (!response.ok) {
    const error = new Error((body && body.error) || `${response.status}`);
    error.status = response.status;
    throw error;
  }
  return body;
}

function askToken(reason) {
  const dialog = document.getElementById("token-dialog");
  if (dialog.open) return;
  const p = dialog.querySelector("p");
  p.textContent = reason
    ? `The admin refused: ${reason}. Its token is kept in this tab only.`
    : "This admin asks for its token (admin_token). It is kept in this tab only.";
  document.getElementById("token-input").value = "";
  dialog.showModal();
}

function setupToken() {
  const dialog = document.getElementById("token-dialog");
  document.getElementById("token-button").addEventListener("click", () => askToken(null));
  dialog.addEventListener("close", () => {
    if (dialog.returnValue !== "save") return;
    const value = document.getElementById("token-input").value.trim();
    if (value) sessionStorage.setItem(TOKEN_KEY, value);
    else sessionStorage.removeItem(TOKEN_KEY);
    refresh();
  });
}

// === small DOM helpers ===

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function ident(name) {
  return name.replace(/[^A-Za-z0-9_-]/g, "_");
}

function setStatus(text, error) {
  const status = document.getElementById("status");
  status.textContent = text;
  status.classList.toggle("error", !!error);
}

function time(ms) {
  return new Date(ms).toLocaleTimeString();
}

function duration(ms) {
  if (ms === null || ms === undefined) return "?";
  if (ms < 1000) return `${ms} ms`;
  if (ms < 120000) return `${(ms / 1000).toFixed(ms < 10000 ? 1 : 0)} s`;
  return `${(ms / 60000).toFixed(1)} min`;
}

function pct(x) {
  return `${Number(x).toFixed(x >= 10 || x === 0 ? 0 : 1)} %`;
}

// === charts (uPlot) ===

// Joins columns that each have their own times into one table: the sampler takes every
// series at the same instants, so the union of the times is exact.
function join(columns) {
  const times = new Set();
  for (const c of columns) for (const t of c.t) times.add(t);
  const t = Array.from(times).sort((a, b) => a - b);
  const index = new Map(t.map((x, i) => [x, i]));
  const data = [t];
  for (const c of columns) {
    const values = new Array(t.length).fill(null);
    c.t.forEach((x, i) => (values[index.get(x)] = c.values[i]));
    data.push(values);
  }
  return data;
}

// Draws `data` (uPlot's columns) with `series` in `container`, under `key`: the chart is
// kept and given new data while its series stay the same, made again when they change.
function chart(key, container, title, series, data, yLabel) {
  const shape = JSON.stringify(series.map((s) => s.label));
  const existing = gray.charts[key];
  if (existing && existing.shape === shape && existing.plot.root.isConnected) {
    existing.plot.setData(data);
    return existing.plot;
  }
  if (existing) existing.plot.destroy();
  container.textContent = "";
  container.append(el("h4", { text: title }));
  const width = Math.max(320, Math.min(container.clientWidth || 440, 720));
  const opts = {
    width,
    height: 170,
    scales: { x: { time: true } },
    axes: [{}, { label: yLabel, size: 56 }],
    legend: { live: true },
    series: [{ label: "time" }].concat(
      series.map((s, i) =>
        Object.assign({ stroke: PALETTE[i % PALETTE.length], width: 1.5, spanGaps: false }, s)
      )
    ),
  };
  const plot = new uPlot(opts, data, container);
  gray.charts[key] = { plot, shape };
  return plot;
}

// === rollouts ===

function reasonText(t) {
  const r = t.reason || {};
  const c = r.counts;
  const judged = c
    ? `${c.copies} copies (${c.copy_mismatches} mismatched, ${c.copy_slow} slower) and ${c.controls} controls (${c.control_mismatches} mismatched)`
    : "";
  switch (r.kind) {
    case "start": return "started by an operator";
    case "advance": {
      const power = r.power === null || r.power === undefined ? "" : `, the errors test's power ${pct(r.power * 100)}`;
      return `held ${duration(r.held_ms)} with no alarm, ${r.users} users in gray${power}: the next step`;
    }
    case "gate": return `the hold was met; the next step (${pct(r.next_weight)}) waits for a resume`;
    case "stale": return `no evidence for the stale time (last at ${r.last_evidence_ms ? time(r.last_evidence_ms) : "never"}): paused until it comes back`;
    case "no_data": return `no gray request for the stale time (last at ${r.last_gray_request_ms ? time(r.last_gray_request_ms) : "never"}): paused until gray serves again`;
    case "fresh": return "evidence and gray traffic came back: going on";
    case "outage": return "gray and baseline failed together (a shared outage): paused, the hold not counted";
    case "recovered": return "baseline's errors are back to normal: the step starts again";
    case "pause": return "paused by an operator";
    case "resume": return "resumed by an operator";
    case "alarm": {
      const ratio = r.leading_ratio ? `; the evidence favours gray at ${r.leading_ratio.toFixed(1)}× baseline` : "";
      return `the ${STREAM_NAMES[r.stream] || r.stream} test alarmed: ln M ${r.log_m.toFixed(2)} reached its line ${r.alarm_at.toFixed(2)} (bad users: gray ${r.gray}, baseline ${r.baseline})${ratio}`;
    }
    case "kill_switch":
      return `the kill switch tripped: gray ${r.gray_errors} errors in ${r.gray_requests} requests, baseline ${r.baseline_errors} in ${r.baseline_requests}, over ${duration(r.window_ms)}`;
    case "shadow_alarm":
      return `the shadow's ${r.stream} stream alarmed: ln M ${r.log_m.toFixed(2)} reached ${r.alarm_at.toFixed(2)} over ${judged}`;
    case "shadow_passed":
      return `the shadow held ${duration(r.held_ms)} with no alarm over ${judged}: the first step`;
    case "complete": return "the last step's hold was met: at 100 %";
    case "promote": return "promoted by an operator";
    case "abort": return "aborted by an operator";
    default: return `${r.kind || "?"} ${JSON.stringify(r)}`;
  }
}

// `pause_reason` is `{"kind": "manual"}`, or `{"kind": "gate", "step": 2}`, …
function pauseText(p) {
  if (!p) return null;
  switch (p.kind) {
    case "manual": return "by an operator";
    case "gate": return `the next step (${p.step + 1}) is gated: a resume enters it`;
    case "stale": return "no evidence; goes on by itself when evidence comes back";
    case "no_data": return "no gray traffic; goes on by itself when gray serves again";
    case "outage": return "a shared outage; goes on by itself when baseline recovers";
    default: return JSON.stringify(p);
  }
}

const COMMANDS = [
  ["start", "Start", ""],
  ["pause", "Pause", "/pause"],
  ["resume", "Resume", "/resume"],
  ["promote", "Promote to 100 %", "/promote"],
  ["abort", "Abort (back to 0 %)", "/abort"],
];

function rolloutCard(service) {
  const id = `rollout-${ident(service)}`;
  let card = document.getElementById(id);
  if (card) return card;
  const commands = el("div", { class: "commands" });
  for (const [command, label] of COMMANDS) {
    const button = el("button", { type: "button", "data-command": command, text: label });
    button.addEventListener("click", () => runCommand(service, command, card));
    commands.append(button);
  }
  card = el(
    "article",
    { class: "card rollout", id, "data-service": service },
    el("div", { class: "card-head" },
      el("h3", { text: service }),
      el("span", { class: "phase", "data-phase": "pending", text: "…" }),
      el("span", { class: "weight", text: "" }),
      el("span", { class: "facts muted" })),
    el("ol", { class: "steps" }),
    commands,
    el("div", { class: "command-result" }),
    el("div", { class: "charts" },
      el("div", { class: "chart weight-chart" }),
      el("div", { class: "chart evidence-chart" })),
    el("div", { class: "shadow" }),
    el("h4", { text: "Last transitions" }),
    el("ol", { class: "transitions", reversed: true })
  );
  document.getElementById("rollout-list").append(card);
  return card;
}

async function runCommand(service, command, card) {
  const spec = COMMANDS.find((c) => c[0] === command);
  const view = gray.rollouts[service];
  const where = view ? ` (now ${view.phase} at ${pct(view.weight)})` : "";
  if (!window.confirm(`${spec[1]}: the rollout of ${service}${where}?`)) return;
  const result = card.querySelector(".command-result");
  result.classList.remove("error");
  result.textContent = `${command}…`;
  try {
    const answer = await api(`/rollouts/${encodeURIComponent(service)}${spec[2]}`, { method: "POST" });
    result.textContent = `${command}: done, now ${answer && answer.phase ? `${answer.phase} at ${pct(answer.weight)}` : "accepted"}`;
  } catch (e) {
    result.classList.add("error");
    result.textContent = `${command} refused: ${e.message}`;
  }
  refresh();
}

function drawRollout(view, history) {
  const card = rolloutCard(view.service);
  const phase = card.querySelector(".phase");
  phase.dataset.phase = view.phase;
  phase.textContent = view.phase.replace("_", " ");
  card.querySelector(".weight").textContent = `gray ${pct(view.weight)}`;
  const facts = [`rule ${view.rule}`];
  if (view.leader) facts.push("this gateway leads");
  if (view.cut_off) facts.push("CUT OFF from the store: weight 0 here");
  if (view.unsaved) facts.push("a rollback is not saved yet");
  if (view.config_skew) facts.push(`configuration skew: ${view.config_skew.reason}`);
  const pause = pauseText(view.pause_reason);
  if (pause) facts.push(`paused: ${pause}`);
  card.querySelector(".facts").textContent = facts.join(" · ");

  const steps = card.querySelector("ol.steps");
  steps.textContent = "";
  if (view.shadow || view.phase === "shadow") {
    steps.append(el("li", { class: view.phase === "shadow" ? "current" : "done", text: "shadow" }));
  }
  view.steps.forEach((w, i) => {
    const current = view.step === i && (view.phase === "step" || view.phase === "paused");
    const done = view.phase === "promoted" || (view.step !== null && i < view.step);
    steps.append(el("li", { class: current ? "current" : done ? "done" : null, text: pct(w) }));
  });

  if (history && history.t) {
    chart(`rollout-${view.service}-weight`, card.querySelector(".weight-chart"), "Gray's weight (%)",
      [{ label: "weight %", paths: uPlot.paths.stepped({ align: 1 }) }], [history.t, history.weight], "%");
    const series = [];
    const data = [history.t];
    for (const [stream, values] of Object.entries(history.log_m || {})) {
      if (!values.some((v) => v !== null)) continue;
      series.push({ label: `ln M ${STREAM_NAMES[stream] || stream}` });
      data.push(values);
    }
    const alarm = history.alarm_at || {};
    for (const [which, line] of [["rollout", alarm.rollout], ["shadow", alarm.shadow]]) {
      if (line === null || line === undefined) continue;
      series.push({ label: `alarm line (${which})`, dash: [6, 4], stroke: "#991b1b" });
      data.push(history.t.map(() => line));
    }
    if (series.length) {
      chart(`rollout-${view.service}-evidence`, card.querySelector(".evidence-chart"),
        "The test's evidence against gray (ln M) and its alarm lines", series, data, "ln M");
    } else {
      card.querySelector(".evidence-chart").textContent = "No evidence yet.";
    }
  }

  drawShadow(card.querySelector(".shadow"), view.shadow);

  const transitions = card.querySelector("ol.transitions");
  transitions.textContent = "";
  const list = (view.transitions || []).slice(-10).reverse();
  for (const t of list) {
    transitions.append(el("li", { class: `transition reason-${t.reason && t.reason.kind}` },
      el("strong", { text: `${time(t.at_ms)} ${t.from} → ${t.to}` }),
      ` at ${pct(t.weight)}: ${reasonText(t)}`));
  }
  if (!list.length) transitions.append(el("li", { class: "muted", text: "none yet" }));
}

function drawShadow(box, shadow) {
  box.textContent = "";
  if (!shadow) return;
  const c = shadow.counts;
  box.append(
    el("h4", { text: "Shadow" }),
    el("p", {
      text: `${c.copies} copies judged, ${c.copy_mismatches} mismatched and ${c.copy_slow} slower; ${c.controls} controls (baseline against baseline), ${c.control_mismatches} mismatched. ln M: mismatches ${shadow.mismatch_log_m.toFixed(2)}, slower ${shadow.slow_log_m.toFixed(2)}, alarm at ${shadow.alarm_at.toFixed(2)}.`,
    }),
    el("p", { class: "muted", text: shadow.noise && shadow.noise.length ? `Learned noise: ${shadow.noise.join(", ")}` : "No noise learned." })
  );
  const rows = (shadow.recent_mismatches || []).slice(-10).reverse();
  if (!rows.length) return;
  const table = el("table", { class: "mismatches" },
    el("tr", {}, el("th", { text: "request" }), el("th", { text: "baseline" }), el("th", { text: "shadow" }), el("th", { text: "differs in" })));
  for (const m of rows) {
    table.append(el("tr", {},
      el("td", { text: `${m.method} ${m.path}` }),
      el("td", { text: `${m.primary_status} in ${m.primary_ms.toFixed(1)} ms` }),
      el("td", { text: `${m.copy_status} in ${m.copy_ms.toFixed(1)} ms` }),
      el("td", { text: m.differences.join(", ") })));
  }
  box.append(el("h4", { text: "Latest mismatches" }), table);
}

async function refreshRollouts() {
  const { rollouts } = await api("/rollouts");
  const names = Object.keys(rollouts);
  document.getElementById("no-rollouts").hidden = names.length > 0;
  const histories = await Promise.all(
    names.map((n) => api(`/rollouts/${encodeURIComponent(n)}/history`).catch(() => null))
  );
  names.forEach((name, i) => {
    gray.rollouts[name] = rollouts[name];
    drawRollout(rollouts[name], histories[i]);
  });
}

// === services ===

function serviceCard(service) {
  const id = `service-${ident(service)}`;
  let card = document.getElementById(id);
  if (card) return card;
  card = el("article", { class: "card service", id, "data-service": service },
    el("div", { class: "card-head" }, el("h3", { text: service }), el("span", { class: "facts muted" })),
    el("table", { class: "instances" }),
    el("div", { class: "charts" },
      el("div", { class: "chart requests-chart" }),
      el("div", { class: "chart errors-chart" }),
      el("div", { class: "chart latency-chart" })));
  document.getElementById("service-list").append(card);
  return card;
}

function drawService(name, service, lanes) {
  const card = serviceCard(name);
  const facts = [];
  if (service.rollout) facts.push("rollout configured");
  if (service.mirror) facts.push(`mirrored to ${service.mirror}`);
  card.querySelector(".facts").textContent = facts.join(" · ");
  const table = card.querySelector("table.instances");
  table.textContent = "";
  table.append(el("tr", {}, el("th", { text: "lane" }), el("th", { text: "instance" }), el("th", { text: "versions" }), el("th", { text: "state" })));
  const instances = service.instances.slice().sort((a, b) => (a.lane || "").localeCompare(b.lane || "") || a.id.localeCompare(b.id));
  for (const i of instances) {
    table.append(el("tr", { class: "instance" },
      el("td", { text: i.lane || "baseline" }),
      el("td", { text: i.id }),
      el("td", { text: i.versions.join(", ") || "–" }),
      el("td", { class: `availability-${i.availability}`, text: i.availability })));
  }
  if (!instances.length) table.append(el("tr", {}, el("td", { colspan: 4, class: "muted", text: "no instance" })));

  const laneNames = Object.keys(lanes || {}).sort();
  if (!laneNames.length) {
    card.querySelector(".requests-chart").textContent = "No request yet.";
    return;
  }
  const cols = (field) => laneNames.map((l) => ({ t: lanes[l].t, values: lanes[l][field] }));
  chart(`service-${name}-requests`, card.querySelector(".requests-chart"), "Requests per second, by lane",
    laneNames.map((l) => ({ label: l })), join(cols("requests_per_s")), "req/s");
  chart(`service-${name}-errors`, card.querySelector(".errors-chart"), "Errors per second, by lane",
    laneNames.map((l) => ({ label: l })), join(cols("errors_per_s")), "err/s");
  const latency = [];
  const latencySeries = [];
  for (const l of laneNames) {
    latency.push({ t: lanes[l].t, values: lanes[l].p50_ms }, { t: lanes[l].t, values: lanes[l].p99_ms });
    latencySeries.push({ label: `${l} p50` }, { label: `${l} p99`, dash: [4, 3] });
  }
  chart(`service-${name}-latency`, card.querySelector(".latency-chart"), "Latency (ms), by lane",
    latencySeries, join(latency), "ms");
}

async function refreshServices() {
  const [{ services }, history] = await Promise.all([api("/services"), api("/services/history")]);
  for (const [name, service] of Object.entries(services)) {
    gray.services[name] = service;
    drawService(name, service, history.services[name]);
  }
}

// === explain ===

function setupExplain() {
  document.getElementById("explain-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const out = document.getElementById("explain-result");
    const ask = { path: document.getElementById("explain-path").value || "/", headers: {}, cookies: {} };
    const ip = document.getElementById("explain-ip").value.trim();
    if (ip) ask.client_ip = ip;
    for (const line of document.getElementById("explain-headers").value.split("\n")) {
      const at = line.indexOf(":");
      if (at > 0) ask.headers[line.slice(0, at).trim()] = line.slice(at + 1).trim();
    }
    for (const pair of document.getElementById("explain-cookies").value.split(";")) {
      const at = pair.indexOf("=");
      if (at > 0) ask.cookies[pair.slice(0, at).trim()] = pair.slice(at + 1).trim();
    }
    out.textContent = "…";
    try {
      const answer = await api("/explain", {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify(ask),
      });
      out.textContent = "";
      out.append(el("p", { id: "explain-summary", text: explainSummary(answer) }), el("pre", { text: JSON.stringify(answer, null, 2) }));
    } catch (e) {
      out.textContent = `refused: ${e.message}`;
    }
  });
}

function explainSummary(answer) {
  if (answer.edge && answer.edge.refused) return `The edge refuses it with ${answer.edge.refused}.`;
  const rule = answer.edge && answer.edge.rule_name ? `rule ${answer.edge.rule_name}` : answer.edge ? answer.edge.decided_by : "nothing";
  const parts = [`Lane ${answer.lane || "baseline"} (decided by ${rule}).`];
  for (const [service, d] of Object.entries(answer.services || {})) {
    const routed = d.outcome && d.outcome.routed;
    if (routed) parts.push(`${service}: ${routed.candidates.join(", ") || "none"}${routed.fallback ? " (fallback)" : ""}.`);
    else parts.push(`${service}: unroutable.`);
  }
  return parts.join(" ");
}

// === the loop ===

let running = null;

async function refresh() {
  if (running) return running;
  running = (async () => {
    try {
      await Promise.all([refreshRollouts(), refreshServices()]);
      gray.polls += 1;
      setStatus(`live · updated ${new Date().toLocaleTimeString()}`, false);
    } catch (e) {
      setStatus(e instanceof Unauthorized ? "this admin needs its token to be read" : `cannot read the admin: ${e.message}`, true);
    } finally {
      running = null;
    }
  })();
  return running;
}

function start() {
  setupToken();
  setupExplain();
  refresh();
  setInterval(refresh, 1000);
}

start();
