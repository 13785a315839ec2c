// Multi-model serving and configuration errors of `infera serve --config deploy.yaml`:
// two models in one process plus one on its own port, each answering under its own name;
// a model whose weights are corrupt fails alone (the others serve, /ready and /v1/models
// show it); every configuration error gives its message and a non-zero exit before
// anything loads.
//
//   node server_config.mjs <path-to-infera-binary>
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";

import { chatmlTemplate, check, checkEq, finish, freePort, postJson, requireFixture, runServeExpectingFailure, startServer, storiesDir, waitFor } from "./server_common.mjs";

requireFixture(storiesDir);

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "infera-server-config-"));
process.on("exit", () => fs.rmSync(tmp, { recursive: true, force: true }));
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function writeConfig(name, text) {
  const file = path.join(tmp, name);
  fs.writeFileSync(file, text);
  return file;
}

// A model directory like stories260K but with corrupt weights (passes validation, fails to load).
const corrupt = path.join(tmp, "corrupt");
fs.mkdirSync(corrupt);
for (const f of ["config.json", "tokenizer.json", "tokenizer_config.json"]) fs.copyFileSync(path.join(storiesDir, f), path.join(corrupt, f));
fs.writeFileSync(path.join(corrupt, "model.safetensors"), "this is not a safetensors file");

const port = await freePort();
const ownPort = await freePort();
const deploy = writeConfig("deploy.yaml", `
server:
  host: 127.0.0.1
  port: ${port}
models:
  - name: alpha
    path: ${storiesDir}
    chat_template: ${chatmlTemplate}
    max_num_seqs: 4
  - name: beta
    path: ${storiesDir}
    profile: long-context
    kv_cache_memory: 64MiB
  - name: gamma
    path: ${storiesDir}
    port: ${ownPort}
  - name: broken
    path: ${corrupt}
`);

const server = await startServer(["--config", deploy], { port, waitReady: false });
try {
  const base = server.url;
  const own = `http://127.0.0.1:${ownPort}`;
  // Wait until every model left "loading".
  let states = {};
  const until = Date.now() + 20000;
  while (Date.now() < until) {
    try {
      const m = await (await fetch(`${base}/v1/models`)).json();
      states = Object.fromEntries(m.data.map((d) => [d.id, d.state]));
      if (Object.values(states).every((s) => s !== "loading")) break;
    } catch {}
    await sleep(50);
  }
  checkEq(states, { alpha: "ready", beta: "ready", gamma: "ready", broken: "failed" }, "model states");
  const ready = await fetch(`${base}/ready`);
  checkEq(ready.status, 503, "/ready is 503 while a model has failed");
  const readyBody = await ready.json();
  checkEq(readyBody.models.find((m) => m.name === "broken")?.state, "failed", "/ready lists the failed model");

  for (const name of ["alpha", "beta", "gamma"]) {
    const r = await postJson(`${base}/v1/completions`, { model: name, prompt: "Once upon a time", max_tokens: 8, temperature: 0 });
    checkEq(r.status, 200, `${name} answers on the main port`);
    checkEq(r.json?.model, name, `${name} answers under its own name`);
  }
  const chat = await postJson(`${base}/v1/chat/completions`, { model: "alpha", messages: [{ role: "user", content: "Hi" }], max_tokens: 4 });
  checkEq(chat.status, 200, "alpha has a chat template");
  const noTemplate = await postJson(`${base}/v1/chat/completions`, { model: "beta", messages: [{ role: "user", content: "Hi" }], max_tokens: 4 });
  checkEq(noTemplate.status, 400, "beta has no chat template: 400");
  const failed = await postJson(`${base}/v1/completions`, { model: "broken", prompt: "x", max_tokens: 2 });
  checkEq(failed.status, 503, "the failed model answers 503");
  check(!failed.text.includes(corrupt), "no paths in the 503");
  const missingModel = await postJson(`${base}/v1/completions`, { prompt: "x", max_tokens: 2 });
  checkEq(missingModel.status, 400, "several models: 'model' is required");

  // gamma's own port serves gamma only.
  const g = await postJson(`${own}/v1/completions`, { model: "gamma", prompt: "Once", max_tokens: 4 });
  checkEq(g.status, 200, "gamma on its own port");
  checkEq(g.json?.model, "gamma", "gamma's own port answers as gamma");
  const gDefault = await postJson(`${own}/v1/completions`, { prompt: "Once", max_tokens: 4 });
  checkEq(gDefault.json?.model, "gamma", "gamma's own port needs no model field");
  const notHere = await postJson(`${own}/v1/completions`, { model: "alpha", prompt: "Once", max_tokens: 4 });
  checkEq(notHere.status, 404, "alpha is not served on gamma's port");
  const ownModels = await (await fetch(`${own}/v1/models`)).json();
  checkEq(ownModels.data.map((d) => d.id), ["gamma"], "gamma's port lists gamma only");
  checkEq((await fetch(`${own}/ready`)).status, 200, "gamma's port is ready");
  // A request is counted just after its client has the response.
  let metricsText = "";
  await waitFor(async () => {
    metricsText = await (await fetch(`${base}/metrics`)).text();
    return metricsText.includes('infera_requests_total{model="gamma",status="200"} 3');
  });
  check(metricsText.includes('infera_model_state{model="broken",state="failed"} 1'), "metrics show the failed model");
  check(metricsText.includes('infera_requests_total{model="gamma",status="200"} 3'), "metrics count gamma's requests on both ports");
} finally {
  const { code } = await server.stop("SIGTERM");
  checkEq(code, 0, "server exits 0 after SIGTERM");
}

// Configuration errors: each names its field, exits non-zero, and nothing is served.
const noTokenizer = path.join(tmp, "no_tokenizer");
fs.mkdirSync(noTokenizer);
fs.copyFileSync(path.join(storiesDir, "config.json"), path.join(noTokenizer, "config.json"));
fs.copyFileSync(path.join(storiesDir, "model.safetensors"), path.join(noTokenizer, "model.safetensors"));
const unknownArch = path.join(tmp, "unknown_arch");
fs.mkdirSync(unknownArch);
for (const f of ["tokenizer.json", "tokenizer_config.json", "model.safetensors"]) fs.copyFileSync(path.join(storiesDir, f), path.join(unknownArch, f));
const cfg = JSON.parse(fs.readFileSync(path.join(storiesDir, "config.json"), "utf8"));
fs.writeFileSync(path.join(unknownArch, "config.json"), JSON.stringify({ ...cfg, model_type: "mamba9000", architectures: ["Mamba9000ForCausalLM"] }));
const badTemplate = path.join(tmp, "bad.jinja");
fs.writeFileSync(badTemplate, "{% for m in messages %}\n{{ m.content }\n{% endfor %}\n");
const busy = net.createServer();
const busyPort = await new Promise((resolve) => busy.listen(0, "127.0.0.1", () => resolve(busy.address().port)));
const p1 = await freePort();
const p2 = await freePort();

const model = (extra) => `  - name: m\n    path: ${storiesDir}\n${extra ?? ""}`;
const errorCases = [
  ["missing path", `server: {port: ${p1}}\nmodels:\n  - name: m\n    path: ${path.join(tmp, "nowhere")}\n`, ["models[0] ('m').path", "not a readable directory"]],
  ["tokenizer.json missing", `server: {port: ${p1}}\nmodels:\n  - name: m\n    path: ${noTokenizer}\n`, ["has no tokenizer.json"]],
  ["unknown architecture", `server: {port: ${p1}}\nmodels:\n  - name: m\n    path: ${unknownArch}\n`, ["mamba9000"]],
  ["duplicate names", `server: {port: ${p1}}\nmodels:\n${model()}${model()}`, ["'m' is used by two models"]],
  ["two models on one port", `server: {port: ${p1}}\nmodels:\n  - {name: a, path: ${storiesDir}, port: ${p2}}\n  - {name: b, path: ${storiesDir}, port: ${p2}}\n`, [`${p2} is also used by models[0].port`]],
  ["model on the server's port", `server: {port: ${p1}}\nmodels:\n  - {name: a, path: ${storiesDir}, port: ${p1}}\n`, [`${p1} is also used by server.port`]],
  ["port in use", `server: {port: ${busyPort}}\nmodels:\n${model()}`, ["server.port: cannot listen", String(busyPort)]],
  ["limits over the memory budget", `server: {port: ${p1}}\nmodels:\n${model("    kv_cache_memory: 10KB\n")}`, ["kv_cache_memory", "raise kv_cache_memory"]],
  ["max_input_len over the context", `server: {port: ${p1}}\nmodels:\n${model("    max_input_len: 100000\n")}`, ["max_input_len: 100000 must be in [1, 512]"]],
  ["chat template that does not parse", `server: {port: ${p1}}\nmodels:\n${model(`    chat_template: ${badTemplate}\n`)}`, ["does not parse", "line 2"]],
  ["misspelt setting", `server: {port: ${p1}}\nmodels:\n${model("    max_ouput_len: 5\n")}`, ["models[0].max_ouput_len: unknown setting"]],
  ["not YAML", `models: [\n`, ["not valid YAML", "line"]],
  ["no models", `server: {port: ${p1}}\n`, ["models: expected a list"]],
  ["api key for an unknown model", `server:\n  port: ${p1}\n  api_keys:\n    - {id: a, key: long-enough-key, models: [nope]}\nmodels:\n${model()}`, ["no model is named 'nope'"]],
  ["several problems at once", `server: {port: ${p1}}\nmodels:\n  - {name: a, path: ${path.join(tmp, "nowhere")}}\n  - {name: a, path: ${storiesDir}, profile: fast}\n`, ["3 problems", "not a readable directory", "used by two models", "profile"]],
];
for (const [name, yaml, needles] of errorCases) {
  const file = writeConfig(`bad-${name.replace(/\W+/g, "_")}.yaml`, yaml);
  const { code, output } = await runServeExpectingFailure(["--config", file]);
  check(code !== 0 && code !== null, `${name}: non-zero exit (${code})`);
  for (const n of needles) check(output.includes(n), `${name}: message mentions ${JSON.stringify(n)}:\n${output}`);
  check(!output.includes("listening on"), `${name}: nothing was served`);
}
busy.close();
const cli = await runServeExpectingFailure(["-m", path.join(tmp, "nowhere"), "--port", String(p1)]);
check(cli.code !== 0 && cli.output.includes("not a readable directory"), `wrong -m path fails at start-up:\n${cli.output}`);
const both = await runServeExpectingFailure(["-m", storiesDir, "--config", deploy]);
check(both.code !== 0 && both.output.includes("either --config or -m"), "-m and --config together are refused");
finish("server_config");
