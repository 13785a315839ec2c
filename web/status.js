// The status page: polls GET /v1/stats (the same counters as /metrics) once a second and
// shows each model's state, layout, limits, KV use, queue, caches, speculative decoding,
// expert load, and charts of throughput, TTFT and inter-token latency percentiles.
import { api, askForKey, el, formatBytes, formatNumber, formatSeconds, forgetKey, showBanner, svg } from "./common.js";

const POLL_MS = 1000;
const HISTORY = 300; // samples kept per model (five minutes at one a second)
const WINDOW_S = 10; // percentiles over the last ten seconds
const $ = (id) => document.getElementById(id);

const history = new Map(); // model name -> [{t, gen, prompt, ttft, tpot}]
let paused = false;
let timer = 0;

// Prometheus' histogram_quantile over cumulative bucket counts (the last one is +Inf).
export function quantile(q, bounds, buckets) {
  const total = buckets[buckets.length - 1];
  if (!total) return null;
  const rank = q * total;
  for (let i = 0; i < buckets.length; ++i) {
    if (buckets[i] >= rank) {
      if (i >= bounds.length) return bounds[bounds.length - 1];
      const lower = i === 0 ? 0 : bounds[i - 1];
      const below = i === 0 ? 0 : buckets[i - 1];
      const inBucket = buckets[i] - below;
      return inBucket > 0 ? lower + ((bounds[i] - lower) * (rank - below)) / inBucket : bounds[i];
    }
  }
  return bounds[bounds.length - 1];
}

function bucketDelta(now, before) {
  return now.buckets.map((b, i) => b - (before ? before.buckets[i] : 0));
}

function fact(label, value, key) {
  return [el("dt", {}, label), el("dd", key ? { "data-stat": key } : {}, value)];
}

function bar(parts, total, label) {
  const track = el("div", { class: "bar", role: "img", "aria-label": label });
  for (const [value, cls] of parts) {
    const seg = el("div", { class: `bar-part ${cls}` });
    seg.style.width = `${total > 0 ? Math.min(100, (100 * value) / total) : 0}%`;
    track.append(seg);
  }
  return track;
}

// ---- charts --------------------------------------------------------------------------------
const W = 600;
const H = 170;
const PAD = { l: 52, r: 10, t: 12, b: 22 };

function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

// series: [{name, cls, points: [[t, v|null], ...]}]; x spans the last `span` seconds.
function lineChart(title, series, format, span) {
  const now = Date.now() / 1000;
  const x0 = now - span;
  const values = series.flatMap((s) => s.points.map((p) => p[1]).filter((v) => v !== null));
  const ymax = niceMax(Math.max(0, ...values));
  const x = (t) => PAD.l + ((t - x0) / span) * (W - PAD.l - PAD.r);
  const y = (v) => H - PAD.b - (v / ymax) * (H - PAD.t - PAD.b);
  const chart = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img", "aria-label": title });
  for (const f of [0, 0.5, 1]) {
    const v = ymax * f;
    chart.append(svg("line", { x1: PAD.l, x2: W - PAD.r, y1: y(v), y2: y(v), class: "grid" }));
    chart.append(svg("text", { x: PAD.l - 6, y: y(v) + 4, class: "axis", "text-anchor": "end" }, format(v)));
  }
  chart.append(svg("text", { x: PAD.l, y: H - 4, class: "axis" }, span >= 120 ? `−${Math.round(span / 60)} min` : `−${Math.round(span)} s`));
  chart.append(svg("text", { x: W - PAD.r, y: H - 4, class: "axis", "text-anchor": "end" }, "now"));
  for (const s of series) {
    let d = "";
    let pen = false;
    for (const [t, v] of s.points) {
      if (v === null || t < x0) {
        pen = false;
        continue;
      }
      d += `${pen ? "L" : "M"}${x(t).toFixed(1)},${y(v).toFixed(1)}`;
      pen = true;
    }
    if (d) chart.append(svg("path", { d, class: `series ${s.cls}` }));
  }
  const legend = el("div", { class: "legend" }, ...series.map((s) => el("span", { class: `key ${s.cls}` }, s.name)));
  return el("figure", { class: "chart-box" }, el("figcaption", {}, title), chart, legend);
}

function percentileSeries(samples, field) {
  const out = { p50: [], p95: [], p99: [] };
  for (let i = 0; i < samples.length; ++i) {
    const now = samples[i];
    let j = i;
    while (j > 0 && now.t - samples[j - 1].t <= WINDOW_S) --j;
    const before = j < i ? samples[j] : null;
    const h = now[field];
    const delta = before ? bucketDelta(h, before[field]) : null;
    const has = delta && delta[delta.length - 1] > 0;
    for (const [k, q] of [["p50", 0.5], ["p95", 0.95], ["p99", 0.99]]) {
      out[k].push([now.t, has ? quantile(q, h.bounds, delta) : null]);
    }
  }
  return out;
}

function charts(name) {
  const samples = history.get(name) || [];
  const gen = [];
  const prompt = [];
  for (let i = 1; i < samples.length; ++i) {
    const dt = samples[i].t - samples[i - 1].t;
    if (dt <= 0) continue;
    gen.push([samples[i].t, (samples[i].gen - samples[i - 1].gen) / dt]);
    prompt.push([samples[i].t, (samples[i].prompt - samples[i - 1].prompt) / dt]);
  }
  // The last minute at first, growing to the five minutes kept.
  const span = Math.min(HISTORY, Math.max(60, samples.length ? samples.at(-1).t - samples[0].t : 0));
  const ttft = percentileSeries(samples, "ttft");
  const itl = percentileSeries(samples, "tpot");
  const ms = (v) => (v >= 1 ? `${+v.toFixed(v >= 10 ? 0 : 1)} s` : `${+(v * 1000).toFixed(v >= 0.1 ? 0 : 1)} ms`);
  const rate = (v) => formatNumber(v, v < 10 ? 1 : 0);
  return el(
    "div",
    { class: "charts" },
    lineChart("Throughput (tokens/s)", [
      { name: "generated", cls: "s1", points: gen },
      { name: "prompt", cls: "s2", points: prompt },
    ], rate, span),
    lineChart(`Time to first token (percentiles over ${WINDOW_S} s)`, [
      { name: "p50", cls: "s1", points: ttft.p50 },
      { name: "p95", cls: "s2", points: ttft.p95 },
      { name: "p99", cls: "s3", points: ttft.p99 },
    ], ms, span),
    lineChart(`Inter-token latency (percentiles over ${WINDOW_S} s)`, [
      { name: "p50", cls: "s1", points: itl.p50 },
      { name: "p95", cls: "s2", points: itl.p95 },
      { name: "p99", cls: "s3", points: itl.p99 },
    ], ms, span),
  );
}

// ---- expert load heatmap ------------------------------------------------------------------
function heatmap(model) {
  const layers = model.expert_load;
  const experts = model.experts;
  const cell = Math.max(4, Math.min(28, Math.floor(720 / experts)));
  const rowH = Math.max(12, Math.min(22, cell));
  const left = 64;
  const width = left + experts * cell + 70;
  const height = layers.length * rowH + 24;
  const map = svg("svg", { viewBox: `0 0 ${width} ${height}`, width, height, class: "heatmap", role: "img", "aria-label": `Tokens routed to each expert, per layer, of ${model.name}` });
  layers.forEach((layer, row) => {
    const total = layer.tokens.reduce((a, b) => a + b, 0);
    const mean = total / experts;
    const max = Math.max(...layer.tokens);
    map.append(svg("text", { x: left - 6, y: row * rowH + rowH * 0.75, class: "axis", "text-anchor": "end" }, `layer ${layer.layer}`));
    layer.tokens.forEach((n, e) => {
      const ratio = mean > 0 ? n / mean : 0;
      const heat = Math.min(1, ratio / 2);
      const fill = total > 0 ? `hsl(${Math.round(215 - 205 * heat)}, 75%, ${Math.round(92 - 47 * heat)}%)` : "hsl(0, 0%, 88%)";
      map.append(
        svg("rect", { x: left + e * cell, y: row * rowH, width: cell - 1, height: rowH - 1, fill, class: "cell" },
          svg("title", {}, `layer ${layer.layer}, expert ${e}: ${n} tokens (${total ? ((100 * n) / total).toFixed(1) : 0}% of the layer)`)),
      );
    });
    map.append(svg("text", { x: left + experts * cell + 6, y: row * rowH + rowH * 0.75, class: "axis" }, mean > 0 ? `max ${(max / mean).toFixed(2)}×` : "–"));
  });
  map.append(svg("text", { x: left, y: height - 6, class: "axis" }, "expert 0"));
  map.append(svg("text", { x: left + experts * cell, y: height - 6, class: "axis", "text-anchor": "end" }, `${experts - 1}`));
  return el(
    "figure",
    { class: "chart-box" },
    el("figcaption", {}, "Expert load per layer (colour: share against an even split; max: busiest expert over the mean)"),
    map,
  );
}

// ---- cards --------------------------------------------------------------------------------
function serverCard(s) {
  const m = s.memory;
  $("server-facts").replaceChildren(
    ...fact("Version", s.version, "version"),
    ...fact("Uptime", formatSeconds(s.uptime_s), "uptime"),
    ...fact("Kernel path", s.kernel_path, "kernel-path"),
    ...fact("CPU features", s.cpu_features),
    ...fact("Threads", formatNumber(s.threads)),
    ...fact("Build", `${s.build.type} · ${s.build.compiler}${s.build.mpi ? " · MPI" : ""}`, "build"),
    ...fact("Compiler flags", s.build.flags.trim() || "–"),
    ...fact("API keys", s.api_keys ? "required" : "none (loopback guard)"),
    ...fact("In flight", formatNumber(s.in_flight), "in-flight"),
    ...fact("Draining", s.draining ? "yes" : "no"),
    ...fact("Memory (resident / plan)", `${formatBytes(m.rss_bytes)} / ${formatBytes(m.planned_bytes)} (peak ${formatBytes(m.peak_rss_bytes)})`, "memory"),
  );
  const memBar = bar([[m.rss_bytes, "used"]], Math.max(m.planned_bytes, m.rss_bytes), "resident memory against the plan");
  $("server-facts").append(el("dt", {}, ""), el("dd", {}, memBar));
}

const LOAD_STEPS = {
  reading: "reading the weight files",
  converting: "converting the GGUF tensors",
  binding: "binding the weights",
  starting: "starting the engine",
};

// While a model loads: a bar of the whole load and the step it is in.
function loadProgress(model) {
  const p = model.load_progress || { fraction: 0, step: "" };
  const percent = Math.floor(100 * p.fraction);
  const step = LOAD_STEPS[p.step] || p.step || "waiting to start";
  const text = `${percent}% · ${step}` + (p.steps ? ` (step ${Math.min(p.steps_done + 1, p.steps)} of ${p.steps})` : "");
  return el("div", { class: "load-progress" },
    el("progress", { max: "100", value: String(percent), "data-stat": "load-progress", "aria-label": `loading ${model.name}: ${text}` }),
    el("p", { class: "muted", "data-stat": "load-step" }, `${text}, for ${formatSeconds(model.load_seconds)}`));
}

function stateBadge(model) {
  return el("span", { class: `badge state-${model.state}`, "data-stat": "state" }, model.state);
}

function modelCard(model) {
  const c = model.counters;
  const e = model.engine;
  const l = model.limits;
  const requests = Object.values(c.requests).reduce((a, b) => a + b, 0);
  const card = el("section", { class: "card model-card", "data-model": model.name, "aria-label": `Model ${model.name}` });
  card.append(el("h2", {}, model.name, " ", stateBadge(model)));
  if (model.state === "loading") card.append(loadProgress(model));
  else if (model.state === "ready") card.append(el("p", { class: "muted" }, `loaded in ${formatSeconds(model.load_seconds)}`));
  if (model.failure) card.append(el("p", { class: "error", "data-stat": "failure" }, `Failed: ${model.failure}`));

  const layout = el("dl", { class: "facts" },
    ...fact("Architecture", `${model.architecture} (${model.model_type})`, "architecture"),
    ...fact("Shape", `${model.layers} layers · hidden ${model.hidden_size} · vocabulary ${formatNumber(model.vocab_size)}`),
    ...(model.experts ? fact("Experts", `${model.experts} (top ${model.experts_per_token})`) : []),
    ...fact("Quantization", model.quantization, "quantization"),
    ...fact("KV cache dtype", model.kv_dtype),
    ...fact("Threads", formatNumber(model.threads), "threads"),
    ...fact("TP / EP", `${model.tp} / ${model.ep}`, "tp-ep"),
    ...fact("Speculative", model.speculative.method === "none" ? "off" : `${model.speculative.method} (${model.speculative.num_draft_tokens || "default"} draft tokens)`),
    ...fact("Prefix cache", model.prefix_cache ? "on" : "off"),
  );
  const limits = el("dl", { class: "facts" },
    ...fact("Context", formatNumber(l.max_context), "max-context"),
    ...fact("Max input / output", `${formatNumber(l.max_input_len)} / ${formatNumber(l.max_output_len)}`),
    ...fact("Batch tokens / sequences", `${formatNumber(l.max_batch_tokens)} / ${formatNumber(l.max_num_seqs)}`),
    ...fact("Prefill chunk", formatNumber(l.prefill_chunk)),
    ...fact("Queue limit", formatNumber(l.max_queue)),
    ...fact("Weights / KV budget", `${formatBytes(model.memory.weights_bytes)} / ${formatBytes(model.memory.kv_budget_bytes)}`),
  );
  const tt = c.ttft, tp = c.tpot, e2e = c.e2e;
  const pct = (h, q) => formatSeconds(quantile(q, h.bounds, h.buckets));
  const live = el("dl", { class: "facts" },
    ...fact("Requests", formatNumber(requests), "requests-total"),
    ...fact("Succeeded (200)", formatNumber(c.requests["200"] || 0), "requests-ok"),
    ...fact("By status", Object.entries(c.requests).map(([s, n]) => `${s}: ${n}`).join(" · ") || "–", "requests-by-status"),
    ...fact("Prompt tokens", formatNumber(c.prompt_tokens), "prompt-tokens"),
    ...fact("Generated tokens", formatNumber(c.generation_tokens), "generation-tokens"),
    ...fact("TTFT p50 / p95", `${pct(tt, 0.5)} / ${pct(tt, 0.95)}`, "ttft"),
    ...fact("Inter-token p50 / p95", `${pct(tp, 0.5)} / ${pct(tp, 0.95)}`, "itl"),
    ...fact("Latency p50 / p95", `${pct(e2e, 0.5)} / ${pct(e2e, 0.95)}`),
  );
  if (e) {
    const kvFree = e.kv_blocks_total - e.kv_blocks_used - e.kv_blocks_cached;
    live.append(
      ...fact("Running / waiting", `${e.running} / ${e.waiting}`, "running-waiting"),
      ...fact("KV blocks used / cached / total", `${formatNumber(e.kv_blocks_used)} / ${formatNumber(e.kv_blocks_cached)} / ${formatNumber(e.kv_blocks_total)}`, "kv-blocks"),
      el("dt", {}, "KV use"),
      el("dd", {}, bar([[e.kv_blocks_used, "used"], [e.kv_blocks_cached, "cached"]], e.kv_blocks_total, `KV blocks: ${e.kv_blocks_used} used, ${e.kv_blocks_cached} cached, ${kvFree} free`)),
      ...fact("Preemptions", formatNumber(e.preemptions), "preemptions"),
      ...fact("Prefix-cache hit rate", e.prefix_queried_blocks ? `${(100 * e.prefix_hit_rate).toFixed(1)}% of ${formatNumber(e.prefix_queried_blocks)} blocks` : "– (no lookups yet)", "prefix-hit-rate"),
      ...fact("Speculative acceptance", e.spec_drafted ? `${(100 * e.spec_acceptance_rate).toFixed(1)}% · ${e.spec_tokens_per_step.toFixed(2)} tokens/step` : "–", "spec-acceptance"),
    );
    if (e.parallel) live.append(...fact("Collectives", `${formatNumber(e.parallel.collectives)} over ${e.parallel.ranks} ranks · ${formatSeconds(e.parallel.comm_seconds)} waiting`));
  }
  card.append(
    el("div", { class: "columns" },
      el("div", {}, el("h3", {}, "Layout"), layout),
      el("div", {}, el("h3", {}, "Limits"), limits),
      el("div", {}, el("h3", {}, "Now"), live)),
  );
  card.append(charts(model.name));
  if (model.expert_load?.length) card.append(heatmap(model));
  return card;
}

function record(stats) {
  const t = Date.now() / 1000;
  for (const m of stats.models) {
    const list = history.get(m.name) || [];
    list.push({ t, gen: m.counters.generation_tokens, prompt: m.counters.prompt_tokens, ttft: m.counters.ttft, tpot: m.counters.tpot });
    while (list.length > HISTORY) list.shift();
    history.set(m.name, list);
  }
}

async function poll() {
  clearTimeout(timer);
  if (paused) return;
  try {
    const response = await api("/v1/stats");
    const stats = await response.json();
    record(stats);
    serverCard(stats.server);
    $("models").replaceChildren(...stats.models.map(modelCard));
    if (!stats.models.length) $("models").append(el("p", { class: "muted" }, "This key may see no model."));
    $("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
    document.body.dataset.polls = String(Number(document.body.dataset.polls || 0) + 1);
    showBanner("");
  } catch (e) {
    showBanner(`Cannot read the status: ${e.message}`);
  }
  timer = setTimeout(poll, document.hidden ? POLL_MS * 5 : POLL_MS);
}

$("pause").addEventListener("click", () => {
  paused = !paused;
  $("pause").textContent = paused ? "Resume" : "Pause";
  $("pause").setAttribute("aria-pressed", String(paused));
  if (!paused) poll();
});
$("key-button").addEventListener("click", async () => {
  forgetKey();
  await askForKey();
  poll();
});
poll();
