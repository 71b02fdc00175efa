// The console page: reads the daemon's JSON (/api/...) every few seconds and draws it.
// No framework and no build step: plain DOM calls and inline SVG, so it works offline.
"use strict";

const REFRESH_MS = 5000;
const PHASE_COLORS = {starting: "#bbb", snapshot: "#6aa0ff", streaming: "#3cb371", rebuilding: "#e0b000",
                      retrying: "#ff8c1a", finished: "#999", stopped: "#999", failed: "#e03030"};

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  for (const child of children) node.append(child instanceof Node ? child : String(child ?? ""));
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  return node;
}

function fmt(value, digits) {
  if (value === null || value === undefined) return "–";
  if (typeof value === "number") return value.toLocaleString("en", {maximumFractionDigits: digits ?? 1});
  return String(value);
}

// The time the charts span: the history's (the last hour at most), so a young daemon's charts
// are not a sliver at the right edge.
function spanOf(history, now) {
  return history.length ? Math.min(3600, Math.max(60, now - history[0].t)) : 3600;
}

// A line chart of one figure over the history's time span.
function lineChart(history, field, label, now) {
  const width = 240, height = 48, span = spanOf(history, now);
  const chart = svg("svg", {class: "chart", width, height, "data-field": field, role: "img"});
  const title = svg("title"); title.textContent = label; chart.append(title);
  const points = history.filter(s => s[field] !== null && s[field] !== undefined);
  const top = Math.max(1e-9, ...points.map(s => s[field]));
  const xy = points.map(s => [width - (now - s.t) / span * width, height - 2 - s[field] / top * (height - 4)]);
  chart.append(svg("polyline", {points: xy.map(([x, y]) => `${x.toFixed(1)},${y.toFixed(1)}`).join(" ")}));
  const text = svg("text", {x: 3, y: 11, "font-size": 10, fill: "#556"});
  text.textContent = `${label} (max ${fmt(top, 2)})`;
  chart.append(text);
  return chart;
}

// A strip coloured by phase over the last hour.
function phaseStrip(history, now) {
  const width = 240, height = 12, span = spanOf(history, now);
  const strip = svg("svg", {class: "chart phases", width, height});
  history.forEach((s, i) => {
    const next = i + 1 < history.length ? history[i + 1].t : now;
    const x = width - (now - s.t) / span * width, w = Math.max(1, (next - s.t) / span * width);
    const rect = svg("rect", {x: x.toFixed(1), y: 0, width: w.toFixed(1), height, fill: PHASE_COLORS[s.phase] || "#ccc"});
    const title = svg("title"); title.textContent = s.phase; rect.append(title);
    strip.append(rect);
  });
  return strip;
}

// Snapshot progress: whatever the connector reports about its snapshot (a field or a detail
// whose name says "snapshot"), and while in the snapshot phase, the rows published so far.
function snapshotProgress(row) {
  const show = v => (typeof v === "object" ? JSON.stringify(v) : fmt(v));
  const fields = [...Object.entries(row), ...Object.entries(row.details || {})]
    .filter(([k, v]) => k.toLowerCase().includes("snapshot") && v !== null && v !== undefined)
    .map(([k, v]) => `${k}: ${show(v)}`);
  if (row.phase === "snapshot") fields.unshift(`${fmt(row.events, 0)} rows so far`);
  if (fields.length) return fields.join("; ");
  return row.kind === "source" && row.phase === "streaming" ? "done" : "–";
}

// A sink's last background verify (`verify:` in its config): when it ended, and per table the
// keys that differ; or why the pass gave no answer. "–" for a sink without background verify.
function verifyResult(row) {
  const v = row.verify;
  if (!v) return el("td", {class: "verify"}, "–");
  const when = new Date(v.at * 1000).toISOString().slice(11, 19);
  if (v.error) return el("td", {class: "verify verify-failed error", "data-at": v.at}, `no answer at ${when}: ${v.error}`);
  const tables = Object.entries(v.tables).map(([table, keys]) =>
    el("div", {class: keys ? "verify-table error" : "verify-table", "data-table": table, "data-keys": keys},
       `${table}: ${keys ? `${fmt(keys, 0)} key(s) differ` : "equal"}`));
  const differ = Object.values(v.tables).some(keys => keys);
  const [verdict, text] = v.equal ? ["equal", "equal"] : differ ? ["differs", "differs"]
    : ["unsettled", "keys still changing"];
  return el("td", {class: `verify verify-${verdict}`, "data-at": v.at}, `${text} at ${when}`, ...tables);
}

function renderConnectors(data) {
  const now = data.now;
  const table = el("table", {id: "connector-table"},
    el("tr", {}, ...["connector", "kind", "phase", "events", "lag (s)", "events/s", "snapshot", "verify",
                     "phase · lag · throughput, last hour", "details"].map(h => el("th", {}, h))));
  for (const row of data.connectors) {
    const history = row.history || [];
    const rate = history.length ? history[history.length - 1].events_per_s : null;
    const details = Object.entries(row.details || {}).map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`).join(" ");
    const error = row.last_error ? el("div", {class: "error last-error"}, row.last_error) : "";
    table.append(el("tr", {class: "connector", "data-name": row.name, "data-phase": row.phase},
      el("td", {class: row.healthy ? "name" : "name unhealthy"}, row.name),
      el("td", {}, row.kind),
      el("td", {}, el("span", {class: `phase phase-${row.phase}`}, row.phase), error),
      el("td", {class: "num events"}, fmt(row.events, 0)),
      el("td", {class: "num lag"}, fmt(row.lag_seconds, 2)),
      el("td", {class: "num rate"}, fmt(rate, 1)),
      el("td", {class: "snapshot"}, snapshotProgress(row)),
      verifyResult(row),
      el("td", {}, phaseStrip(history, now), el("br"), lineChart(history, "lag_seconds", "lag s", now),
         el("br"), lineChart(history, "events_per_s", "events/s", now)),
      el("td", {class: "details"}, details)));
  }
  document.getElementById("connectors").replaceChildren(table);
}

function renderDeadLetters(topics) {
  const box = document.getElementById("dead-letters");
  if (!topics.length) { box.replaceChildren(el("p", {id: "no-dead-letters"}, "no dead letters")); return; }
  const parts = [];
  for (const t of topics) {
    parts.push(el("h3", {class: "dead-letter-sink", "data-sink": t.sink},
                  `${t.sink}: `, el("span", {class: "dead-letter-count"}, t.count), ` letter(s) in ${t.topic}`));
    const table = el("table", {class: "dead-letters"},
      el("tr", {}, ...["from", "key", "size", "reason"].map(h => el("th", {}, h))));
    for (const letter of t.latest) {
      table.append(el("tr", {class: "dead-letter"},
        el("td", {}, `${letter.topic}[${letter.partition}]@${letter.offset}`),
        el("td", {class: "cols"}, letter.key ?? "null"),
        el("td", {class: "num"}, fmt(letter.size, 0)),
        el("td", {class: "reason"}, letter.reason)));
    }
    parts.push(table);
  }
  box.replaceChildren(...parts);
}

function renderSchemas(tables) {
  const box = document.getElementById("schemas");
  if (!tables.length) { box.replaceChildren(el("p", {}, "no schema records yet")); return; }
  const table = el("table", {id: "schema-table"},
    el("tr", {}, ...["table", "source", "version", "when", "columns", "ddl"].map(h => el("th", {}, h))));
  for (const t of tables) {
    t.versions.forEach((v, i) => {
      table.append(el("tr", {class: "schema-version", "data-table": t.table, "data-version": v.version},
        el("td", {}, i === 0 ? t.table : ""),
        el("td", {}, i === 0 ? (t.source ?? "") : ""),
        el("td", {class: "num version"}, v.version ?? "–"),
        el("td", {}, v.ts_ms ? new Date(v.ts_ms).toISOString() : "–"),
        el("td", {class: "cols"}, v.columns.map(c => `${c.name} ${c.type}${c.key ? " (key)" : ""}`).join(", ")),
        el("td", {class: "cols"}, v.ddl ?? "")));
    });
  }
  box.replaceChildren(table);
}

async function load(path, render, boxId) {
  try {
    const response = await fetch(path, {cache: "no-store"});
    const body = await response.json();
    if (!response.ok) throw new Error(body.error || response.statusText);
    render(body);
  } catch (err) {
    document.getElementById(boxId).replaceChildren(el("p", {class: "error load-error"}, `${path}: ${err.message}`));
  }
}

async function refresh() {
  await Promise.all([load("/api/connectors", renderConnectors, "connectors"),
                     load("/api/dead-letters", renderDeadLetters, "dead-letters"),
                     load("/api/schemas", renderSchemas, "schemas")]);
  const stamp = document.getElementById("updated");
  stamp.textContent = `updated ${new Date().toISOString()}`;
  stamp.setAttribute("data-loaded", "1");
}

refresh();
setInterval(refresh, REFRESH_MS);
