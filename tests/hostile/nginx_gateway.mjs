// Infera behind a real gateway: Debian's nginx runs examples/nginx.conf (ports, a
// self-signed certificate made here and log paths rewritten) in front of `infera serve`
// on the built-in model, all on loopback. Checks: a chat completion streams through TLS
// as SSE and ends with [DONE], with the same text as the non-streamed answer; the
// streamed response is not buffered (nginx passes it chunked, without Content-Length);
// nginx's body and header limits answer 413 / 400 before Infera sees the request.
// Exits 77 (skipped) when nginx or openssl is not installed (scripts/install-deps.sh --test).
//
//   node tests/hostile/nginx_gateway.mjs <path-to-infera-binary>
import { spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import https from "node:https";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, "..", "..");
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const SKIP = 77;

function which(name, extra = []) {
  for (const dir of [...(process.env.PATH || "").split(":"), ...extra]) {
    const p = path.join(dir, name);
    try {
      fs.accessSync(p, fs.constants.X_OK);
      return p;
    } catch {}
  }
  return null;
}

const bin = process.argv[2] && path.resolve(process.argv[2]);
if (!bin) {
  console.error("usage: node nginx_gateway.mjs <path-to-infera-binary>");
  process.exit(2);
}
const nginx = which("nginx", ["/usr/sbin", "/usr/local/sbin"]);
const openssl = which("openssl");
if (!nginx || !openssl) {
  console.log(`SKIP: ${!nginx ? "nginx" : "openssl"} is not installed (scripts/install-deps.sh --test installs it)`);
  process.exit(SKIP);
}

const children = new Set();
process.on("exit", () => {
  for (const p of children) {
    try {
      p.kill("SIGKILL");
    } catch {}
  }
});
for (const sig of ["SIGINT", "SIGTERM"]) process.on(sig, () => process.exit(1));

async function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.on("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

let failures = 0;
let checks = 0;
function check(cond, what) {
  ++checks;
  if (!cond) {
    ++failures;
    console.error(`FAIL: ${what}`);
  }
}

// One HTTPS request through the gateway; resolves with status, headers, body and the
// number of separate reads the body arrived in.
function call(port, method, target, { body = null, headers = {}, ca, timeoutMs = 30000 } = {}) {
  return new Promise((resolve) => {
    const payload = body === null ? null : Buffer.from(typeof body === "string" ? body : JSON.stringify(body));
    const req = https.request(
      {
        host: "127.0.0.1",
        port,
        method,
        path: target,
        ca,
        servername: "localhost",
        headers: { ...(payload ? { "content-type": "application/json", "content-length": payload.length } : {}), ...headers },
        timeout: timeoutMs,
      },
      (res) => {
        const parts = [];
        res.on("data", (d) => parts.push(d));
        res.on("end", () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(parts).toString("utf8"), reads: parts.length }));
        res.on("error", (e) => resolve({ status: null, error: String(e) }));
      },
    );
    req.on("timeout", () => req.destroy(new Error("timeout")));
    req.on("error", (e) => resolve({ status: null, error: String(e) }));
    if (payload) req.write(payload);
    req.end();
  });
}

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "infera-nginx-"));
try {
  // A self-signed certificate for localhost / 127.0.0.1, valid for a day.
  const cert = path.join(tmp, "cert.pem");
  const key = path.join(tmp, "key.pem");
  const gen = spawnSync(openssl, ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert, "-days", "1",
                                  "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                        { encoding: "utf8", timeout: 60000 });
  if (gen.status !== 0) throw new Error(`openssl failed: ${gen.stderr}`);
  const ca = fs.readFileSync(cert);

  // Infera on loopback (no keys: the guard sees nginx's forwarded Host, 127.0.0.1).
  const inferaPort = await freePort();
  const infera = spawn(bin, ["serve", "--host", "127.0.0.1", "--port", String(inferaPort), "-t", "1", "--max-output-len", "64",
                             "--kv-cache-memory", "64MiB"], { cwd: repo, stdio: ["ignore", "pipe", "pipe"] });
  children.add(infera);
  let inferaLog = "";
  infera.stdout.on("data", (d) => (inferaLog = (inferaLog + d).slice(-20000)));
  infera.stderr.on("data", (d) => (inferaLog = (inferaLog + d).slice(-20000)));

  // nginx with the example configuration, rewritten for this run.
  const gatewayPort = await freePort();
  let conf = fs.readFileSync(path.join(repo, "examples", "nginx.conf"), "utf8");
  const rewrite = (from, to) => {
    check(conf.includes(from), `examples/nginx.conf still has '${from}'`);
    conf = conf.replace(from, to);
  };
  rewrite("listen 443 ssl;", `listen 127.0.0.1:${gatewayPort} ssl;`);
  rewrite("server 127.0.0.1:8000;", `server 127.0.0.1:${inferaPort};`);
  rewrite("ssl_certificate     /etc/ssl/infera/cert.pem;", `ssl_certificate ${cert};`);
  rewrite("ssl_certificate_key /etc/ssl/infera/key.pem;", `ssl_certificate_key ${key};`);
  rewrite("access_log /var/log/nginx/infera-access.log;",
          `access_log ${tmp}/access.log;\n  client_body_temp_path ${tmp}/body;\n  proxy_temp_path ${tmp}/proxy;\n` +
          `  fastcgi_temp_path ${tmp}/fastcgi;\n  uwsgi_temp_path ${tmp}/uwsgi;\n  scgi_temp_path ${tmp}/scgi;`);
  rewrite("worker_processes auto;", `worker_processes 1;\npid ${tmp}/nginx.pid;\nerror_log ${tmp}/error.log;`);
  const confPath = path.join(tmp, "nginx.conf");
  fs.writeFileSync(confPath, conf);
  const test = spawnSync(nginx, ["-t", "-p", tmp, "-c", confPath], { encoding: "utf8", timeout: 30000 });
  check(test.status === 0, `nginx -t accepts the configuration: ${test.stderr}`);
  const gw = spawn(nginx, ["-p", tmp, "-c", confPath, "-g", "daemon off;"], { stdio: ["ignore", "pipe", "pipe"] });
  children.add(gw);
  let gwLog = "";
  gw.stderr.on("data", (d) => (gwLog = (gwLog + d).slice(-20000)));

  // Both up: /ready through the gateway.
  let ready = false;
  for (let i = 0; i < 600 && !ready; ++i) {
    if (infera.exitCode !== null) throw new Error(`infera serve exited: ${inferaLog}`);
    if (gw.exitCode !== null) throw new Error(`nginx exited: ${gwLog} ${fs.existsSync(`${tmp}/error.log`) ? fs.readFileSync(`${tmp}/error.log`, "utf8") : ""}`);
    const r = await call(gatewayPort, "GET", "/ready", { ca, timeoutMs: 2000 });
    ready = r.status === 200;
    if (!ready) await sleep(100);
  }
  check(ready, "the server is ready behind the gateway");

  const body = { messages: [{ role: "user", content: "In the beginning" }], max_tokens: 24, temperature: 0, ignore_eos: true };
  const plain = await call(gatewayPort, "POST", "/v1/chat/completions", { body, ca });
  check(plain.status === 200, `non-streamed completion through TLS: ${plain.status} ${plain.body?.slice(0, 300)}`);
  const plainText = JSON.parse(plain.body || "{}").choices?.[0]?.message?.content;
  check(typeof plainText === "string" && plainText.length > 0, "a non-empty answer");

  const streamed = await call(gatewayPort, "POST", "/v1/chat/completions", { body: { ...body, stream: true }, ca });
  check(streamed.status === 200, `streamed completion through TLS: ${streamed.status}`);
  check(/^text\/event-stream/.test(streamed.headers?.["content-type"] ?? ""), `content-type ${streamed.headers?.["content-type"]}`);
  check(streamed.headers?.["content-length"] === undefined, "a stream has no Content-Length (it is not buffered whole)");
  check(streamed.headers?.["transfer-encoding"] === "chunked", `chunked through the gateway: ${streamed.headers?.["transfer-encoding"]}`);
  const events = (streamed.body ?? "").split("\n\n").filter((e) => e.startsWith("data: "));
  check(events.length >= 3 && events[events.length - 1] === "data: [DONE]", `SSE events ending with [DONE] (${events.length})`);
  let text = "";
  for (const e of events.slice(0, -1)) {
    const j = JSON.parse(e.slice(6));
    text += j.choices?.[0]?.delta?.content ?? "";
  }
  check(text === plainText, `streamed text equals the non-streamed one: ${JSON.stringify(text)} vs ${JSON.stringify(plainText)}`);

  // The gateway's limits answer before Infera does.
  const huge = await call(gatewayPort, "POST", "/v1/chat/completions", { body: JSON.stringify({ ...body, x: "a".repeat(5 << 20) }), ca });
  check(huge.status === 413, `body over client_max_body_size: ${huge.status}`);
  const bigHeader = await call(gatewayPort, "GET", "/health", { headers: { "x-big": "h".repeat(20000) }, ca });
  check(bigHeader.status === 400, `header over large_client_header_buffers: ${bigHeader.status}`);
  const health = await call(gatewayPort, "GET", "/health", { ca });
  check(health.status === 200, "GET /health through the gateway");
  // Plain HTTP on the TLS port is refused by nginx, not passed on.
  const plainHttp = await new Promise((resolve) => {
    const s = net.connect({ host: "127.0.0.1", port: gatewayPort }, () => s.write("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"));
    let out = "";
    s.on("data", (d) => (out += d));
    s.on("close", () => resolve(out));
    s.on("error", () => resolve(out));
    setTimeout(() => s.destroy(), 5000);
  });
  check(/^HTTP\/1\.1 400/.test(plainHttp), `plain HTTP on the TLS port: ${plainHttp.slice(0, 60)}`);

  gw.kill("SIGQUIT");
  infera.kill("SIGTERM");
  await Promise.race([Promise.all([new Promise((r) => gw.once("exit", r)), new Promise((r) => infera.once("exit", r))]), sleep(15000)]);
} catch (e) {
  ++failures;
  console.error(`FAIL: ${e?.stack || e}`);
} finally {
  fs.rmSync(tmp, { recursive: true, force: true });
}
if (failures) {
  console.error(`nginx_gateway: ${failures} of ${checks} checks failed`);
  process.exit(1);
}
console.log(`nginx_gateway: all ${checks} checks passed`);
process.exit(0);
