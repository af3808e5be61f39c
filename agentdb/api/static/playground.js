// The agentdb playground: plain JavaScript over the public HTTP API (/sources, /agents/retrieval with
// stream: true, /agents, /sources/{name}/documents/{id}, /sources/{name}/indexes/...). Nothing it shows is
// ever parsed as HTML: every text from the server goes through textContent.
"use strict";

const state = {
  key: "", // the API key: in this page's memory only, never stored
  sources: [],
  walk: null,
  agents: [],
  editing: null,
  query: "",
};

const $ = (id) => document.getElementById(id);

// Create an element with properties (textContent, className, ...) and children.
function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (name === "dataset") Object.assign(node.dataset, value);
    else node[name] = value;
  }
  for (const child of children) {
    if (child !== null && child !== undefined) node.append(child);
  }
  return node;
}

// --- the API -------------------------------------------------------------------------------------------

function headers(json) {
  const out = {};
  if (json) out["content-type"] = "application/json";
  if (state.key) out.authorization = `Bearer ${state.key}`;
  return out;
}

// One call: {ok, status, data} where data is the parsed JSON (an error envelope when not ok).
async function api(method, path, body) {
  let response;
  try {
    response = await fetch(path, {
      method,
      headers: headers(body !== undefined),
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (exc) {
    return { ok: false, status: 0, data: { error: { code: 0, name: "NetworkError", message: String(exc), path: null } } };
  }
  let data = null;
  const text = await response.text();
  if (text) {
    try {
      data = JSON.parse(text);
    } catch (exc) {
      data = { error: { code: response.status, name: "BadResponse", message: text.slice(0, 300), path: null } };
    }
  }
  return { ok: response.ok, status: response.status, data };
}

function errorText(error) {
  const where = error.path ? ` at ${error.path}` : "";
  const hint = error.hint ? ` (${error.hint})` : "";
  return `${error.code} ${error.name}${where}: ${error.message}${hint}`;
}

function show(node, text) {
  node.textContent = text || "";
  node.hidden = !text;
}

function notice(text) {
  show($("notice"), text);
}

// --- sources -------------------------------------------------------------------------------------------

// The source chosen last time (kept in this browser), else the demo's, else the first.
const LAST_SOURCE = "agentdb.playground.source";
const DEMO_SOURCE = "pgdocs";

async function loadSources() {
  const previous = $("source").value || localStorage.getItem(LAST_SOURCE);
  $("source").replaceChildren(el("option", { value: "", textContent: "loading the sources..." }));
  $("source-info").textContent = "Loading the sources...";
  const { ok, status, data } = await api("GET", "/sources");
  $("source").replaceChildren();
  state.sources = [];
  if (!ok) {
    const need = status === 401 ? " This server has principals: enter an API key above." : "";
    notice(`${errorText(data.error)}${need}`);
    renderSourceInfo();
    return;
  }
  notice("");
  state.sources = data;
  for (const source of data) {
    const label = `${source.name} (${source.documents} docs, ${source.chunks} chunks)`;
    $("source").append(el("option", { value: source.name, textContent: label }));
  }
  const preferred = [previous, DEMO_SOURCE].find((name) => data.some((s) => s.name === name));
  if (preferred) $("source").value = preferred;
  renderSourceInfo();
}

function currentSource() {
  return state.sources.find((s) => s.name === $("source").value) || null;
}

function renderSourceInfo() {
  const source = currentSource();
  const info = $("source-info");
  info.replaceChildren();
  $("nav-index").replaceChildren();
  if (!source) {
    info.textContent = "No source visible.";
    return;
  }
  info.append(`${source.documents} documents, ${source.chunks} chunks, ${source.embedding_model}. Filterable: `);
  const filterable = source.fields.filter((f) => f.filterable);
  if (!filterable.length) info.append("none");
  filterable.forEach((field, i) => {
    const button = el("button", {
      type: "button",
      className: "field",
      textContent: `${field.name}: ${field.type}`,
      title: "insert a filter on this field",
    });
    button.addEventListener("click", () => insertFilter(field));
    info.append(i ? " " : "", button);
  });
  loadIndexes(source.name);
}

// The short form, {"field": value}, for a scalar field; a set field takes the node that tests membership.
function insertFilter(field) {
  const sample = { int: 0, float: 0.0, bool: true }[field.type];
  const node = field.type === "string_set"
    ? { op: "in", needle: { value: "" }, haystack: { knowledge: field.name } }
    : { [field.name]: sample === undefined ? "" : sample };
  $("filter").value = JSON.stringify(node);
  $("filter").focus();
}

async function loadIndexes(name) {
  const { ok, data } = await api("GET", `/sources/${encodeURIComponent(name)}/indexes`);
  if ($("source").value !== name) return;
  for (const index of ok ? data : []) {
    $("nav-index").append(el("option", { value: index.name, textContent: `${index.name} (${index.kind}, ${index.edges} edges)`, dataset: { kind: index.kind } }));
  }
  navigable(ok && data.length > 0);
  fitNavigation();
}

// Navigation walks an index: without one it is off, and says why.
function navigable(on) {
  $("nav-on").disabled = !on;
  if (!on) $("nav-on").checked = false;
  $("nav-why").textContent = on ? "" : "This source has no index to walk (`agentdb index create` makes one).";
}

// Graphs take agentic selection only, and a walk needs an index of its strategy's kind.
function fitNavigation() {
  const graph = $("nav-strategy").value === "graph";
  $("nav-depth").disabled = graph; // depth and beam bound tree walks only
  $("nav-beam").disabled = graph;
  $("nav-selection").querySelector('option[value="ranked"]').disabled = graph;
  if (graph) $("nav-selection").value = "agentic";
  const chosen = $("nav-index").selectedOptions[0];
  const kind = graph ? "graph" : "tree";
  const fitting = [...$("nav-index").options].find((o) => o.dataset.kind === kind);
  if (fitting && (!chosen || chosen.dataset.kind !== kind)) $("nav-index").value = fitting.value;
}

// The first tree index of the source (the option), or undefined.
function treeIndex() {
  return [...$("nav-index").options].find((o) => o.dataset.kind === "tree");
}

// --- the request ---------------------------------------------------------------------------------------

function mode() {
  return document.querySelector('input[name="mode"]:checked').value;
}

function number(id) {
  return Number($(id).value);
}

// The filter editor's JSON, or undefined when empty; a parse error is shown and thrown.
function filterValue() {
  const text = $("filter").value.trim();
  if (!text) return undefined;
  try {
    return JSON.parse(text);
  } catch (exc) {
    show($("filter-error"), `invalid JSON: ${exc.message}`);
    $("filter-view").hidden = true;
    throw exc;
  }
}

function buildRequest() {
  const text = $("query").value.trim();
  const spec = {
    table: $("source").value,
    limit: number("top-k"),
    threshold: number("threshold"),
    rrf_k: number("rrf-k"),
    fusion: $("fusion").value,
  };
  if (spec.fusion === "convex") spec.alpha = number("alpha");
  const m = mode();
  if (m !== "lexical") spec.semantic_search = text;
  if (m !== "dense") spec.full_text_search = text;
  const filter = filterValue();
  if (filter !== undefined) spec.filter = filter;
  const request = { query: text, queries: [spec], stream: true, diagnostics: true };
  const navigation = navigationValue();
  if (navigation) {
    request.steps = { retrieval: { navigation } };
    if (navigation.selection === "agentic") request.max_internal_iterations = 8;
  }
  return request;
}

function navigationValue() {
  if (!$("nav-on").checked) return null;
  const strategy = $("nav-strategy").value;
  const navigation = {
    query_index: 0,
    strategy,
    selection: $("nav-selection").value,
    index: $("nav-index").value,
  };
  const start = $("nav-start").value.trim();
  if (start) navigation.start_key = start;
  if (strategy === "tree") {
    navigation.max_depth = number("nav-depth");
    navigation.beam_width = number("nav-beam");
  }
  return navigation;
}

// --- search, streamed ----------------------------------------------------------------------------------

function resetResults() {
  show($("error"), "");
  show($("filter-error"), "");
  $("filter-view").hidden = true;
  $("hits").tBodies[0].replaceChildren();
  $("funnel").replaceChildren("Diagnostics appear after a search.");
  $("walk").replaceChildren();
  showNotices([]);
  $("walk-info").textContent = $("nav-on").checked ? "Waiting for the walk..." : "Turn on navigation to watch a walk.";
  state.walk = null;
}

// While a search or a run is under way the button is off and the results say they are busy.
function busy(on) {
  $("search").disabled = on;
  $("results").setAttribute("aria-busy", String(on));
}

async function search(event) {
  event.preventDefault();
  resetResults();
  let request;
  try {
    request = buildRequest();
  } catch (exc) {
    return;
  }
  state.query = request.query;
  $("status").textContent = "Searching...";
  busy(true);
  try {
    await stream(request);
  } finally {
    busy(false);
  }
}

async function stream(request) {
  let response;
  try {
    response = await fetch("/agents/retrieval", { method: "POST", headers: headers(true), body: JSON.stringify(request) });
  } catch (exc) {
    showError({ code: 0, name: "NetworkError", message: String(exc), path: null });
    return;
  }
  if (!response.ok) {
    const data = await response.json().catch(() => ({ error: { code: response.status, name: "HTTPError", message: response.statusText, path: null } }));
    showError(data.error);
    $("status").textContent = `Refused (${response.status}).`;
    if ($("nav-on").checked) $("walk-info").textContent = "No walk: the request was refused.";
    return;
  }
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let rank = 0;
  for (;;) {
    let chunk;
    try {
      chunk = await reader.read();
    } catch (exc) {
      showError({ code: 0, name: "NetworkError", message: `the stream broke off: ${exc}`, path: null });
      return;
    }
    const { value, done } = chunk;
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let kind = "message";
      let data = "";
      for (const line of block.split("\n")) {
        if (line.startsWith("event: ")) kind = line.slice(7);
        else if (line.startsWith("data: ")) data += line.slice(6);
      }
      const payload = data ? JSON.parse(data) : null;
      if (kind === "hit") addHit(payload, ++rank);
      else onEvent(kind, payload);
    }
  }
}

function onEvent(kind, payload) {
  if (kind === "step_started" && payload.kind === "navigation") {
    const navigation = navigationValue() || {};
    startWalk(payload.details.table, navigation.index, navigation.strategy);
  } else if (kind === "step_progress") {
    walkStep(payload.details);
  } else if (kind === "step_completed") {
    if (payload.kind === "retrieval" && payload.id.startsWith("retrieval_")) {
      const d = payload.details;
      $("status").textContent = `${d.retrieval_mode} search: ${d.result_count} hits in ${payload.duration_ms.toFixed(1)} ms (${d.dropped_by_threshold} dense candidates beyond the threshold)`;
    } else if (payload.id === "navigation") {
      const d = payload.details;
      $("walk-info").textContent = `${d.strategy} walk, ${d.selection}, index ${d.index}: ${d.nodes_read} nodes read in ${d.duration_ms.toFixed(1)} ms${d.stopped ? ` (stopped: ${d.stopped})` : ""}`;
    }
  } else if (kind === "error") {
    showError(payload.error);
  } else if (kind === "done") {
    const count = $("hits").tBodies[0].rows.length;
    $("status").textContent = `${$("status").textContent} · done: ${payload.status}, ${count} hits`;
    const queries = payload.debug_info && payload.debug_info.queries;
    if (queries && queries.length) renderFunnel(queries[0]);
    showNotices(payload.notices);
  }
}

// What the server says the hits do not show (the threshold's toll on the dense leg, for one).
function showNotices(notices) {
  $("notices").replaceChildren(...(notices || []).map((text) => el("li", { textContent: text })));
  $("notices").hidden = !(notices && notices.length);
}

// A JSON response (a saved agent's run): the same views as the stream draws.
function renderResponse(data) {
  resetResults();
  const walked = data.steps.filter((s) => s.kind === "navigation" && s.id !== "navigation");
  const summary = data.steps.find((s) => s.id === "navigation");
  if (summary) {
    startWalk(summary.details.table, summary.details.index, summary.details.strategy);
    walked.forEach((s) => walkStep(s.details));
    onEvent("step_completed", summary);
  }
  data.hits.forEach((hit, i) => addHit(hit, i + 1));
  $("status").textContent = `${data.status}, route ${data.route}: ${data.hits.length} hits`;
  if (data.debug_info && data.debug_info.queries && data.debug_info.queries.length) {
    renderFunnel(data.debug_info.queries[0]);
  }
  showNotices(data.notices);
}

// --- errors at their path ------------------------------------------------------------------------------

const FILTER_PATH = /^(queries\[\d+\]\.filter|filter)(?=$|[.[])/;

function showError(error) {
  const match = error.path ? error.path.match(FILTER_PATH) : null;
  if (match) {
    show($("filter-error"), errorText(error));
    markFilter(error.path.slice(match[0].length), error.message);
  } else {
    show($("error"), errorText(error));
  }
}

const LAST_SEGMENT = /(\.[^.[]+|\[\d+\])$/;

// Draw the filter as JSON with the node at `path` (e.g. ".args[0].rhs") marked; a path to a missing key
// marks its nearest existing ancestor.
function markFilter(path, message) {
  let value;
  try {
    value = JSON.parse($("filter").value);
  } catch (exc) {
    return;
  }
  const paths = new Set();
  collectPaths(value, "", paths);
  let target = path;
  while (!paths.has(target) && target) target = target.replace(LAST_SEGMENT, "");
  const view = $("filter-view");
  view.replaceChildren();
  renderJson(view, value, "", target, message, 0);
  view.hidden = false;
}

function collectPaths(value, path, out) {
  out.add(path);
  if (Array.isArray(value)) value.forEach((v, i) => collectPaths(v, `${path}[${i}]`, out));
  else if (value && typeof value === "object") {
    for (const [k, v] of Object.entries(value)) collectPaths(v, `${path}.${k}`, out);
  }
}

function renderJson(parent, value, path, target, message, depth) {
  let into = parent;
  if (path === target) {
    into = el("mark", { className: "bad", title: message, dataset: { path: target || "$" } });
    parent.append(into);
  }
  const pad = "  ".repeat(depth + 1);
  const close = "  ".repeat(depth);
  if (Array.isArray(value)) {
    into.append("[\n");
    value.forEach((v, i) => {
      into.append(pad);
      renderJson(into, v, `${path}[${i}]`, target, message, depth + 1);
      into.append(i < value.length - 1 ? ",\n" : "\n");
    });
    into.append(`${close}]`);
  } else if (value && typeof value === "object") {
    const entries = Object.entries(value);
    into.append("{\n");
    entries.forEach(([k, v], i) => {
      into.append(`${pad}${JSON.stringify(k)}: `);
      renderJson(into, v, `${path}.${k}`, target, message, depth + 1);
      into.append(i < entries.length - 1 ? ",\n" : "\n");
    });
    into.append(`${close}}`);
  } else {
    into.append(JSON.stringify(value));
  }
  if (path === target) into.append(el("span", { className: "bad-note", textContent: `  <- ${message}` }));
}

// --- hits ----------------------------------------------------------------------------------------------

const STOP = new Set("a an and are as at be by do for from how i in is it of on or the to what when where which who why with".split(" "));

function queryTerms(text) {
  const words = (text.toLowerCase().match(/[\p{L}\p{N}_]+/gu) || []).filter((w) => w.length > 1 && !STOP.has(w));
  // A crude stem, so that "archiving" also marks "archive" and "archived".
  return [...new Set(words.map((w) => (w.length > 5 ? w.replace(/(ing|ed|es|s|e)$/, "") : w)))];
}

function escapeRegExp(text) {
  return text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
}

// A window of `text` around the first query term, the terms marked (text nodes and <mark>, never HTML).
function snippet(text, terms, width = 220) {
  const out = el("span", { className: "snippet" });
  if (!text) return out;
  const pattern = terms.length ? new RegExp(`(?<![\\p{L}\\p{N}_])(${terms.map(escapeRegExp).join("|")})[\\p{L}\\p{N}_]*`, "giu") : null;
  let start = 0;
  if (pattern) {
    const first = text.search(pattern);
    if (first > width / 3) start = first - Math.floor(width / 3);
  }
  let piece = text.slice(start, start + width);
  if (start > 0) piece = `...${piece}`;
  if (start + width < text.length) piece = `${piece}...`;
  if (!pattern) {
    out.textContent = piece;
    return out;
  }
  let last = 0;
  for (const found of piece.matchAll(pattern)) {
    out.append(piece.slice(last, found.index), el("mark", { textContent: found[0] }));
    last = found.index + found[0].length;
  }
  out.append(piece.slice(last));
  return out;
}

function fixed(value, digits) {
  return value === null || value === undefined ? "-" : Number(value).toFixed(digits);
}

function leg(rank, score, digits, label) {
  const name = label.startsWith("rank and BM25") ? "lexical" : "dense";
  if (rank === null || rank === undefined) return el("td", { className: "leg none", textContent: "-", dataset: { label: name } });
  return el("td", { className: "leg", title: label, dataset: { label: name } }, el("b", { textContent: `#${rank}` }), ` ${fixed(score, digits)}`);
}

function addHit(hit, rank) {
  const source = hit._source || {};
  const scores = hit._index_scores || {};
  const chunks = hit._chunks && hit._chunks.length > 1 ? ` (window ${hit._chunks[0]}-${hit._chunks[hit._chunks.length - 1]})` : "";
  const tree = hit._tree ? `depth ${hit._tree.depth}, read #${hit._tree.order + 1}` : "";
  const open = el("button", { type: "button", className: "link", textContent: hit._id, title: "open the whole document" });
  const row = el(
    "tr",
    { dataset: { id: hit._id } },
    el("td", { className: "rank", textContent: String(rank), dataset: { label: "#" } }),
    el("td", { className: "id", dataset: { label: "id" } }, open),
    el("td", { className: "title", textContent: source.title === undefined || source.title === null ? "" : String(source.title), dataset: { label: "title" } }),
    el("td", { className: "num", textContent: fixed(hit._score, 4), dataset: { label: "score" } }),
    leg(scores.rank_dense, scores.distance, 3, "rank and cosine distance"),
    leg(scores.rank_sparse, scores.bm25, 2, "rank and BM25 score"),
    el("td", { dataset: { label: "snippet" } }, snippet(source.text === undefined || source.text === null ? "" : String(source.text), queryTerms(state.query))),
    el("td", { className: "num", textContent: `${hit._chunk}${chunks}${tree ? `; ${tree}` : ""}`, dataset: { label: "chunk" } }),
  );
  row.addEventListener("click", () => openDocument(hit._table, hit._id, hit._chunk));
  $("hits").tBodies[0].append(row);
}

// --- the document --------------------------------------------------------------------------------------

async function openDocument(table, id, chunk) {
  const { ok, data } = await api("GET", `/sources/${encodeURIComponent(table)}/documents/${encodeURIComponent(id)}`);
  if (!ok) {
    showError(data.error);
    return;
  }
  $("doc-title").textContent = data.title || "(untitled)";
  $("doc-id").textContent = `${table} / ${data.id}: ${data.chunks.length} chunk(s)`;
  const meta = $("doc-meta");
  meta.replaceChildren();
  for (const [name, value] of Object.entries(data.metadata || {})) {
    meta.append(el("dt", { textContent: name }), el("dd", { textContent: typeof value === "string" ? value : JSON.stringify(value) }));
  }
  const chunks = $("doc-chunks");
  chunks.replaceChildren();
  let current = null;
  for (const c of data.chunks) {
    const block = el("div", { className: c.chunk === chunk ? "chunk current" : "chunk" }, el("span", { className: "muted", textContent: `chunk ${c.chunk}` }), el("p", { textContent: c.text || "" }));
    if (c.chunk === chunk) current = block;
    chunks.append(block);
  }
  // A tree index over this source: offer to start the next walk at this document.
  $("doc-walk").hidden = !treeIndex() || table !== $("source").value;
  $("doc-walk").dataset.key = data.id;
  const dialog = $("doc");
  if (!dialog.open) dialog.showModal();
  if (current) current.scrollIntoView({ block: "nearest" });
}

// --- the diagnostics funnel ----------------------------------------------------------------------------

function renderFunnel(query) {
  const p = query.parameters || {};
  const m = p.retrieval_mode;
  const bars = [];
  if (m === "dense") {
    bars.push(["dense raw", p.raw_result_count], ["dense within threshold", p.raw_result_count - p.filtered_count]);
  } else if (m === "lexical") {
    bars.push(["lexical raw", p.sparse_raw_count !== undefined ? p.sparse_raw_count : p.raw_result_count]);
  } else {
    bars.push(
      ["dense raw", p.dense_raw_count],
      ["dense within threshold", p.dense_raw_count - p.dense_filtered_count],
      ["lexical raw", p.sparse_raw_count],
      ["fused candidates", p.fused_candidate_count],
    );
  }
  bars.push(["returned", p.result_count]);
  const max = Math.max(1, ...bars.map(([, n]) => Number(n) || 0));
  const funnel = $("funnel");
  funnel.replaceChildren();
  funnel.className = "funnel";
  for (const [label, n] of bars) {
    const bar = el("div", { className: "bar" });
    bar.style.width = `${(100 * (Number(n) || 0)) / max}%`;
    funnel.append(el("div", { className: "funnel-row", dataset: { label } }, el("span", { className: "label", textContent: label }), el("div", { className: "track" }, bar), el("span", { className: "count", textContent: String(n) })));
  }
  const threshold = p.threshold === "inf" ? "no threshold" : `threshold ${p.threshold}`;
  const fusion = m === "hybrid" ? `, fusion ${p.fusion}${p.fusion === "convex" ? "" : ` (rrf_k ${p.rrf_k})`}` : "";
  funnel.append(el("p", { className: "muted", textContent: `${m}, top ${p.top_k}, ${threshold}${fusion}${p.filter ? `, filter ${p.filter}` : ""}` }));
}

// --- the navigation walk -------------------------------------------------------------------------------

function startWalk(table, index, strategy) {
  state.walk = {
    table,
    index,
    strategy,
    steps: [],
    visited: new Map(),
    children: new Map(),
    titles: new Map(),
  };
  $("walk-info").textContent = "Walking...";
  $("walk").replaceChildren();
}

function walkStep(details) {
  const walk = state.walk;
  if (!walk) return;
  walk.steps.push(details);
  walk.visited.set(details.current_key, details);
  drawWalk();
  const key = details.current_key;
  const table = encodeURIComponent(walk.table);
  api("GET", `/sources/${table}/documents/${encodeURIComponent(key)}`).then(({ ok, data }) => {
    if (ok && state.walk === walk) {
      walk.titles.set(key, data.title || "");
      drawWalk();
    }
  });
  if (walk.strategy === "tree" && walk.index) {
    const path = `/sources/${table}/indexes/${encodeURIComponent(walk.index)}/neighbors?key=${encodeURIComponent(key)}&direction=out&max=256`;
    api("GET", path).then(({ ok, data }) => {
      if (ok && state.walk === walk) {
        walk.children.set(key, data.map((n) => n.key));
        drawWalk();
      }
    });
  }
}

function nodeLabel(walk, key, details) {
  const label = el("span", { className: "node-label" });
  if (details) {
    label.append(el("b", { className: "order", textContent: String(details.order + 1) }));
    label.append(" ");
  }
  label.append(el("code", { textContent: key }));
  const title = walk.titles.get(key);
  if (title) label.append(" ", el("span", { className: "node-title", textContent: title }));
  if (details && details.score !== undefined) label.append(el("span", { className: "muted", textContent: ` ${details.score.toFixed(3)}` }));
  if (details) label.addEventListener("click", () => openDocument(walk.table, key, 0));
  return label;
}

const MAX_GREY = 12;

function drawWalk() {
  const walk = state.walk;
  const root = $("walk");
  root.replaceChildren();
  if (walk.strategy === "graph") {
    const path = el("ol", { className: "walk-path" });
    for (const step of walk.steps) {
      const item = el("li", { className: "visited", dataset: { key: step.current_key } });
      if (step.from_key) item.append(el("span", { className: "muted", textContent: `${step.from_key} -${step.edge_type || ""}-> ` }));
      item.append(nodeLabel(walk, step.current_key, step));
      path.append(item);
    }
    root.append(path);
    return;
  }
  const drawn = new Set();
  const tree = el("ul", { className: "walk-tree" });
  const draw = (key, into) => {
    drawn.add(key);
    const details = walk.visited.get(key);
    const item = el("li", { className: "visited", dataset: { key } }, nodeLabel(walk, key, details));
    const known = walk.children.get(key) || [];
    const visitedChildren = [...walk.visited.values()].filter((d) => d.parent === key).map((d) => d.current_key);
    const kids = [...new Set([...known, ...visitedChildren])];
    if (kids.length) {
      const list = el("ul");
      let grey = 0;
      for (const child of kids) {
        if (drawn.has(child)) continue;
        if (walk.visited.has(child)) draw(child, list);
        else if (grey++ < MAX_GREY) list.append(el("li", { className: "unvisited", dataset: { key: child } }, el("code", { textContent: child })));
      }
      if (grey > MAX_GREY) list.append(el("li", { className: "unvisited", textContent: `+${grey - MAX_GREY} more` }));
      item.append(list);
    }
    into.append(item);
  };
  const ordered = [...walk.visited.values()].sort((a, b) => a.order - b.order);
  for (const details of ordered) {
    const parentDrawnLater = details.parent && walk.visited.has(details.parent);
    if (!drawn.has(details.current_key) && !parentDrawnLater) draw(details.current_key, tree);
  }
  root.append(tree);
}

// --- saved agents --------------------------------------------------------------------------------------

async function loadAgents() {
  const list = $("agent-list");
  const { ok, data } = await api("GET", "/agents");
  list.replaceChildren();
  if (!ok) {
    list.append(el("li", { className: "muted", textContent: errorText(data.error) }));
    return;
  }
  state.agents = data;
  if (!data.length) list.append(el("li", { className: "muted", textContent: "No saved agents yet." }));
  for (const agent of data) {
    const run = el("button", { type: "button", className: "small", textContent: "Run" });
    const edit = el("button", { type: "button", className: "small secondary", textContent: "Edit" });
    run.addEventListener("click", () => runAgent(agent));
    edit.addEventListener("click", () => editAgent(agent));
    const nav = agent.navigation ? `, ${agent.navigation.strategy} walk` : "";
    list.append(el("li", { dataset: { agent: agent.name } }, el("b", { textContent: agent.name }), ` on ${agent.source}: ${agent.retrieval_mode}, top ${agent.top_k}, threshold ${agent.threshold}${nav} `, run, " ", edit));
  }
}

async function runAgent(agent) {
  state.query = $("query").value.trim() || agent.input;
  $("status").textContent = `Running agent ${agent.name}...`;
  busy(true);
  const { ok, data } = await api("POST", `/agents/${encodeURIComponent(agent.name)}/run`, { input: $("query").value.trim(), diagnostics: true });
  busy(false);
  if (!ok) {
    resetResults();
    showError(data.error);
    $("status").textContent = `Agent ${agent.name} refused.`;
    return;
  }
  renderResponse(data);
  $("status").textContent = `Agent ${agent.name}: ${$("status").textContent}`;
}

function editAgent(agent) {
  state.editing = agent;
  $("agent-edit-title").textContent = `Edit ${agent.name} (source ${agent.source})`;
  $("agent-mode").value = agent.retrieval_mode;
  $("agent-top-k").value = agent.top_k;
  $("agent-threshold").value = agent.threshold;
  $("agent-rrf-k").value = agent.rrf_k;
  $("agent-iterations").value = agent.max_internal_iterations;
  $("agent-filter").value = agent.filter ? JSON.stringify(agent.filter, null, 1) : "";
  $("agent-navigation").value = agent.navigation ? JSON.stringify(agent.navigation, null, 1) : "";
  show($("agent-error"), "");
  $("agent-edit").hidden = false;
}

function jsonField(id) {
  const text = $(id).value.trim();
  return text ? JSON.parse(text) : null;
}

async function saveAgent(event) {
  event.preventDefault();
  const agent = state.editing;
  let changes;
  try {
    changes = {
      retrieval_mode: $("agent-mode").value,
      top_k: number("agent-top-k"),
      threshold: number("agent-threshold"),
      rrf_k: number("agent-rrf-k"),
      max_internal_iterations: number("agent-iterations"),
      filter: jsonField("agent-filter"),
      navigation: jsonField("agent-navigation"),
    };
  } catch (exc) {
    show($("agent-error"), `invalid JSON: ${exc.message}`);
    return;
  }
  const { ok, data } = await api("PATCH", `/agents/${encodeURIComponent(agent.name)}`, changes);
  if (!ok) {
    show($("agent-error"), errorText(data.error));
    return;
  }
  show($("agent-error"), "");
  $("agent-edit").hidden = true;
  await loadAgents();
}

async function createAgent(event) {
  event.preventDefault();
  let request;
  try {
    request = buildRequest();
  } catch (exc) {
    return;
  }
  const spec = request.queries[0];
  const body = {
    name: $("agent-name").value.trim(),
    source: spec.table,
    input: request.query,
    retrieval_mode: mode(),
    top_k: spec.limit,
    threshold: spec.threshold,
    rrf_k: spec.rrf_k,
  };
  if (spec.filter) body.filter = spec.filter;
  if (request.steps) body.navigation = request.steps.retrieval.navigation;
  const { ok, data } = await api("POST", "/agents", body);
  if (!ok) {
    showError(data.error);
    return;
  }
  $("agent-name").value = "";
  await loadAgents();
}

// --- memory --------------------------------------------------------------------------------------------

async function loadStores() {
  const { ok, data } = await api("GET", "/memory");
  const select = $("memory-store");
  select.replaceChildren();
  $("memory-list").replaceChildren();
  if (!ok) {
    $("memory-info").textContent = errorText(data.error);
    return;
  }
  for (const store of data) {
    select.append(el("option", { value: store.name, textContent: `${store.name} (${store.records} records)` }));
  }
  $("memory-info").textContent = data.length ? "" : "No memory stores.";
  $("memory-recall").disabled = !data.length;
}

// Recall from the chosen store with the query box's text: each memory with its score, why it was a
// candidate and the term that decided its place.
async function recallMemory(event) {
  event.preventDefault();
  const store = $("memory-store").value;
  const params = new URLSearchParams({ query: $("query").value.trim(), top_k: "5", touch: "false" });
  const { ok, data } = await api("GET", `/memory/${encodeURIComponent(store)}?${params}`);
  const list = $("memory-list");
  list.replaceChildren();
  if (!ok) {
    $("memory-info").textContent = errorText(data.error);
    return;
  }
  $("memory-info").textContent = `${data.candidate_count} candidates, ranked by ${data.ranked_by.join(", ") || "nothing that varied"}`;
  for (const memory of data.candidates) {
    const why = `score ${memory.score.toFixed(3)}, via ${memory.via.join(", ")}${memory.decided_by ? `, decided by ${memory.decided_by}` : ""}, importance ${memory.importance}`;
    list.append(el("li", { className: memory.current ? "" : "unvisited", dataset: { id: memory.id } }, el("span", { textContent: memory.text }), el("div", { className: "muted", textContent: why })));
  }
}

// --- wiring --------------------------------------------------------------------------------------------

function start() {
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    state.key = $("api-key").value.trim();
    $("key-state").textContent = state.key ? "Key set (kept in this page's memory only)." : "No key.";
    loadSources();
    loadAgents();
    loadStores();
  });
  $("source").addEventListener("change", () => {
    localStorage.setItem(LAST_SOURCE, $("source").value);
    renderSourceInfo();
  });
  $("fusion").addEventListener("change", () => {
    $("alpha").disabled = $("fusion").value !== "convex"; // alpha weighs convex fusion only
  });
  $("nav-strategy").addEventListener("change", fitNavigation);
  $("doc-close").addEventListener("click", () => $("doc").close());
  $("doc-walk").addEventListener("click", () => {
    $("nav").open = true;
    $("nav-on").checked = true;
    $("nav-strategy").value = "tree";
    $("nav-selection").value = "ranked";
    $("nav-start").value = $("doc-walk").dataset.key;
    if ($("nav-index").selectedOptions[0].dataset.kind !== "tree") $("nav-index").value = treeIndex().value;
    $("doc").close();
    $("query").focus();
  });
  $("search-form").addEventListener("submit", search);
  $("agents-refresh").addEventListener("click", loadAgents);
  $("agent-edit").addEventListener("submit", saveAgent);
  $("agent-cancel").addEventListener("click", () => { $("agent-edit").hidden = true; });
  $("agent-new").addEventListener("submit", createAgent);
  $("filter").addEventListener("input", () => { show($("filter-error"), ""); $("filter-view").hidden = true; });
  $("memory-refresh").addEventListener("click", loadStores);
  $("memory-form").addEventListener("submit", recallMemory);
  loadSources();
  loadAgents();
  loadStores();
}

document.addEventListener("DOMContentLoaded", start);
