// The schema suite: tool definitions in the shapes OpenAI, Anthropic and MCP servers
// publish, nested objects, arrays, enums, recursive $ref, formats and patterns, plus
// variants derived from them (nullable, wrapped in arrays, all-optional). Each entry is
// {name, schema}; the tool shapes are reduced to their parameters schema.

const str = { type: "string" };
const int = { type: "integer" };

// --- tool definitions as published (their parameter schemas) ---
const openaiTools = [
  { type: "function", function: { name: "get_weather", description: "Current weather", parameters: {
    type: "object", properties: { location: { type: "string", description: "City and country" },
      unit: { type: "string", enum: ["celsius", "fahrenheit"] } }, required: ["location"], additionalProperties: false } } },
  { type: "function", function: { name: "send_email", parameters: {
    type: "object", properties: { to: { type: "string", format: "email" }, subject: { type: "string", maxLength: 40 },
      body: { type: "string", maxLength: 80 }, cc: { type: "array", items: { type: "string", format: "email" }, maxItems: 2 } },
    required: ["to", "subject", "body"], additionalProperties: false } } },
  { type: "function", function: { name: "create_event", strict: true, parameters: {
    type: "object", properties: { title: str, start: { type: "string", format: "date-time" }, end: { type: "string", format: "date-time" },
      attendees: { type: ["array", "null"], items: str } }, required: ["title", "start", "end", "attendees"], additionalProperties: false } } },
  { type: "function", function: { name: "search_products", parameters: {
    type: "object", properties: { query: { type: "string", minLength: 1, maxLength: 30 },
      max_price: { type: "number", minimum: 0, maximum: 10000 }, in_stock: { type: "boolean" },
      category: { type: "string", enum: ["books", "toys", "tools", "food"] } }, required: ["query"] } } },
  { type: "function", function: { name: "book_flight", parameters: {
    type: "object", properties: { from: { type: "string", pattern: "^[A-Z]{3}$" }, to: { type: "string", pattern: "^[A-Z]{3}$" },
      date: { type: "string", format: "date" }, passengers: { type: "integer", minimum: 1, maximum: 9 },
      class: { enum: ["economy", "business", "first"] } }, required: ["from", "to", "date", "passengers"], additionalProperties: false } } },
  { type: "function", function: { name: "get_stock_price", parameters: {
    type: "object", properties: { symbol: { type: "string", pattern: "^[A-Z]{1,5}$" } }, required: ["symbol"] } } },
  { type: "function", function: { name: "set_thermostat", parameters: {
    type: "object", properties: { temperature: { type: "integer", minimum: 10, maximum: 30 }, mode: { enum: ["heat", "cool", "auto"] } },
    required: ["temperature"], additionalProperties: false } } },
  { type: "function", function: { name: "no_arguments", parameters: { type: "object", properties: {} } } },
];

const anthropicTools = [
  { name: "get_time", description: "Current time in a zone", input_schema: {
    type: "object", properties: { timezone: { type: "string", description: "IANA zone" } }, required: ["timezone"] } },
  { name: "calculator", input_schema: {
    type: "object", properties: { expression: { type: "string", pattern: "^[0-9+*/() -]{1,20}$" } }, required: ["expression"] } },
  { name: "record_summary", input_schema: {
    type: "object", properties: { key_colors: { type: "array", items: { type: "object", properties: {
      r: { type: "number", minimum: 0, maximum: 1 }, g: { type: "number", minimum: 0, maximum: 1 }, b: { type: "number", minimum: 0, maximum: 1 },
      name: { type: "string", maxLength: 12 } }, required: ["r", "g", "b", "name"] }, maxItems: 3 },
      description: { type: "string", maxLength: 50 }, estimated_year: { type: "integer", minimum: 1800, maximum: 2030 } },
    required: ["key_colors", "description"] } },
  { name: "translate", input_schema: {
    type: "object", properties: { text: { type: "string", maxLength: 60 }, target_language: { enum: ["fr", "de", "es", "ja"] } },
    required: ["text", "target_language"] } },
  { name: "lookup_user", input_schema: {
    type: "object", properties: { user_id: { type: "string", format: "uuid" }, fields: { type: "array", items: { enum: ["email", "name", "plan"] }, minItems: 1, maxItems: 3 } },
    required: ["user_id"] } },
];

const mcpTools = [
  { name: "read_file", description: "Read a file", inputSchema: {
    type: "object", properties: { path: { type: "string", maxLength: 40 }, head: { type: "number" }, tail: { type: "number" } },
    required: ["path"], additionalProperties: false, $schema: "http://json-schema.org/draft-07/schema#" } },
  { name: "write_file", inputSchema: {
    type: "object", properties: { path: { type: "string", maxLength: 40 }, content: { type: "string", maxLength: 80 } },
    required: ["path", "content"], additionalProperties: false } },
  { name: "edit_file", inputSchema: {
    type: "object", properties: { path: { type: "string", maxLength: 40 }, edits: { type: "array", items: {
      type: "object", properties: { oldText: { type: "string", maxLength: 20 }, newText: { type: "string", maxLength: 20 } },
      required: ["oldText", "newText"], additionalProperties: false }, maxItems: 2 }, dryRun: { type: "boolean", default: false } },
    required: ["path", "edits"], additionalProperties: false } },
  { name: "fetch", inputSchema: {
    type: "object", properties: { url: { type: "string", format: "uri", description: "URL to fetch" },
      max_length: { type: "integer", exclusiveMinimum: 0, exclusiveMaximum: 1000000, default: 5000 },
      start_index: { type: "integer", minimum: 0, default: 0 }, raw: { type: "boolean" } }, required: ["url"] } },
  { name: "git_commit", inputSchema: {
    type: "object", properties: { repo_path: { type: "string", maxLength: 30 }, message: { type: "string", minLength: 3, maxLength: 50 } },
    required: ["repo_path", "message"] } },
  { name: "create_entities", inputSchema: {
    type: "object", properties: { entities: { type: "array", items: { type: "object", properties: {
      name: { type: "string", maxLength: 15 }, entityType: { type: "string", maxLength: 15 },
      observations: { type: "array", items: { type: "string", maxLength: 20 }, maxItems: 2 } },
      required: ["name", "entityType", "observations"] }, maxItems: 2 } }, required: ["entities"] } },
  { name: "list_directory", inputSchema: { type: "object", properties: { path: { type: "string", maxLength: 40 } }, required: ["path"] } },
  { name: "run_query", inputSchema: {
    type: "object", properties: { sql: { type: "string", maxLength: 60 }, params: { type: "array", items: { type: ["string", "number", "boolean", "null"] }, maxItems: 3 } },
    required: ["sql"] } },
];

// --- structures ---
const structures = [
  { name: "flat-required", schema: { type: "object", properties: { a: str, b: int, c: { type: "boolean" } }, required: ["a", "b", "c"] } },
  { name: "all-optional", schema: { type: "object", properties: { a: str, b: int }, additionalProperties: false } },
  { name: "nested-3", schema: { type: "object", properties: { outer: { type: "object", properties: { middle: { type: "object",
    properties: { inner: { type: "integer", minimum: -5, maximum: 5 } }, required: ["inner"] } }, required: ["middle"] } }, required: ["outer"] } },
  { name: "array-of-ints", schema: { type: "array", items: { type: "integer", minimum: 0, maximum: 99 }, minItems: 1, maxItems: 5 } },
  { name: "array-unbounded", schema: { type: "array", items: { type: "boolean" } } },
  { name: "array-min3", schema: { type: "array", items: { enum: [1, 2, 3] }, minItems: 3, maxItems: 4 } },
  { name: "tuple", schema: { type: "array", prefixItems: [str, int, { type: "boolean" }], items: false } },
  { name: "tuple-open", schema: { type: "array", prefixItems: [{ const: "head" }], items: int, maxItems: 3 } },
  { name: "matrix", schema: { type: "array", items: { type: "array", items: { type: "number", minimum: 0, maximum: 9 }, minItems: 2, maxItems: 2 }, minItems: 2, maxItems: 2 } },
  { name: "enum-mixed", schema: { enum: ["red", 42, true, null, { x: 1 }, [1, "a"]] } },
  { name: "const-object", schema: { const: { kind: "fixed", n: [1, 2] } } },
  { name: "string-enum", schema: { type: "string", enum: ["alpha", "beta", "gamma delta", "épsilon"] } },
  { name: "type-list", schema: { type: ["integer", "string", "null"], maxLength: 8 } },
  { name: "anyOf-types", schema: { anyOf: [{ type: "integer", minimum: 0, maximum: 9 }, { type: "string", maxLength: 4 }] } },
  { name: "oneOf-objects", schema: { oneOf: [
    { type: "object", properties: { kind: { const: "circle" }, r: { type: "number", minimum: 0, maximum: 10 } }, required: ["kind", "r"], additionalProperties: false },
    { type: "object", properties: { kind: { const: "square" }, side: { type: "integer", minimum: 1, maximum: 9 } }, required: ["kind", "side"], additionalProperties: false }] } },
  // oneOf compiles as anyOf: exact where the alternatives cannot both hold (ajv checks "exactly one").
  { name: "oneOf-types", schema: { oneOf: [{ type: "integer", minimum: 0, maximum: 99 }, { type: "string", maxLength: 6 }, { type: "boolean" }] } },
  { name: "oneOf-enum-discriminator", schema: { type: "array", maxItems: 3, items: { oneOf: [
    { type: "object", properties: { op: { enum: ["add", "sub"] }, a: int, b: int }, required: ["op", "a", "b"] },
    { type: "object", properties: { op: { enum: ["neg"] }, a: int }, required: ["op", "a"] }] } } },
  { name: "oneOf-required-keys", schema: { oneOf: [
    { type: "object", properties: { email: { type: "string", format: "email" } }, required: ["email"] },
    { type: "object", properties: { phone: { type: "string", pattern: "^[0-9]{6}$" } }, required: ["phone"] }] } },
  { name: "allOf-merge", schema: { allOf: [{ type: "object", properties: { id: int }, required: ["id"] },
    { properties: { tag: { type: "string", maxLength: 5 } }, required: ["tag"] }] } },
  { name: "nullable-openapi", schema: { type: "object", properties: { v: { type: "string", nullable: true, maxLength: 6 } }, required: ["v"] } },
  { name: "additional-schema", schema: { type: "object", properties: { id: int }, required: ["id"], additionalProperties: { type: "integer", minimum: 0, maximum: 9 } } },
  { name: "map-of-strings", schema: { type: "object", additionalProperties: { type: "string", maxLength: 5 } } },
  { name: "free-object", schema: { type: "object" } },
  { name: "any-value", schema: {} },
  { name: "integer-bounds-neg", schema: { type: "integer", minimum: -1000, maximum: -7 } },
  { name: "integer-exclusive", schema: { type: "integer", exclusiveMinimum: 5, exclusiveMaximum: 12 } },
  { name: "integer-big", schema: { type: "integer", minimum: 1000000, maximum: 2000000000 } },
  { name: "number-unbounded", schema: { type: "number" } },
  { name: "number-range", schema: { type: "number", minimum: -3, maximum: 3 } },
  { name: "string-len", schema: { type: "string", minLength: 2, maxLength: 6 } },
  { name: "string-exact", schema: { type: "string", minLength: 4, maxLength: 4 } },
  { name: "date", schema: { type: "string", format: "date" } },
  { name: "time", schema: { type: "string", format: "time" } },
  { name: "date-time", schema: { type: "string", format: "date-time" } },
  { name: "uuid", schema: { type: "string", format: "uuid" } },
  { name: "email", schema: { type: "string", format: "email" } },
  { name: "ipv4", schema: { type: "string", format: "ipv4" } },
  { name: "hostname", schema: { type: "string", format: "hostname" } },
  { name: "uri", schema: { type: "string", format: "uri" } },
  { name: "pattern-phone", schema: { type: "string", pattern: "^\\+?[0-9]{7,12}$" } },
  { name: "pattern-unanchored", schema: { type: "string", pattern: "ab+c", maxLength: undefined } },
  { name: "pattern-semver", schema: { type: "string", pattern: "^(0|[1-9]\\d*)\\.(0|[1-9]\\d*)\\.(0|[1-9]\\d*)$" } },
  { name: "pattern-hex-color", schema: { type: "string", pattern: "^#(?:[0-9a-fA-F]{3}){1,2}$" } },
  { name: "pattern-quote", schema: { type: "string", pattern: "^say \"[a-z]{1,5}\"$" } },
  { name: "pattern-words", schema: { type: "string", pattern: "^(?:\\w+ ){0,3}\\w+\\.$" } },
  { name: "recursive-tree", schema: { $defs: { node: { type: "object", properties: { value: { type: "integer", minimum: 0, maximum: 9 },
    children: { type: "array", items: { $ref: "#/$defs/node" }, maxItems: 2 } }, required: ["value"], additionalProperties: false } }, $ref: "#/$defs/node" } },
  { name: "recursive-list", schema: { definitions: { cell: { type: "object", properties: { head: str, tail: { anyOf: [{ $ref: "#/definitions/cell" }, { type: "null" }] } },
    required: ["head", "tail"] } }, $ref: "#/definitions/cell" } },
  { name: "recursive-root", schema: { type: "object", properties: { name: { type: "string", maxLength: 8 }, sub: { type: "array", items: { $ref: "#" }, maxItems: 1 } }, required: ["name"] } },
  { name: "ref-siblings", schema: { $defs: { base: { type: "object", properties: { id: int }, required: ["id"] } },
    $ref: "#/$defs/base", properties: { label: { type: "string", maxLength: 4 } }, required: ["label"] } },
  { name: "json-expr", schema: { $defs: { expr: { anyOf: [{ type: "integer", minimum: 0, maximum: 99 },
    { type: "object", properties: { op: { enum: ["+", "-", "*"] }, args: { type: "array", items: { $ref: "#/$defs/expr" }, minItems: 2, maxItems: 2 } },
      required: ["op", "args"], additionalProperties: false }] } }, $ref: "#/$defs/expr" } },
  { name: "unicode-keys", schema: { type: "object", properties: { "名前": str, "naïve": int }, required: ["名前", "naïve"], additionalProperties: false } },
  { name: "escaped-keys", schema: { type: "object", properties: { "a\"b": int, "c\\d": int, "e/f": int }, required: ["a\"b", "c\\d", "e/f"] } },
  { name: "booleans", schema: { type: "object", properties: { a: { type: "boolean" }, b: { type: "null" } }, required: ["a", "b"] } },
  { name: "deep-array", schema: { type: "array", items: { type: "array", items: { type: "array", items: int, maxItems: 2 }, maxItems: 2 }, maxItems: 2 } },
  { name: "wide-object", schema: { type: "object", properties: Object.fromEntries(Array.from({ length: 12 }, (_, i) => [`f${i}`, { type: "integer", minimum: 0, maximum: 9 }])),
    required: ["f0", "f5", "f11"], additionalProperties: false } },
  { name: "order-status", schema: { type: "object", properties: { order_id: { type: "string", pattern: "^ORD-[0-9]{4}$" },
    status: { enum: ["pending", "shipped", "delivered", "cancelled"] }, updated: { type: "string", format: "date-time" },
    items: { type: "array", items: { type: "object", properties: { sku: { type: "string", pattern: "^[A-Z]{2}[0-9]{3}$" }, qty: { type: "integer", minimum: 1, maximum: 20 } },
      required: ["sku", "qty"], additionalProperties: false }, minItems: 1, maxItems: 3 } }, required: ["order_id", "status", "items"], additionalProperties: false } },
];

function toolEntries() {
  const out = [];
  for (const t of openaiTools) out.push({ name: `openai-${t.function.name}`, schema: t.function.parameters, tool: { name: t.function.name, parameters: t.function.parameters } });
  for (const t of anthropicTools) out.push({ name: `anthropic-${t.name}`, schema: t.input_schema, tool: { name: t.name, parameters: t.input_schema } });
  for (const t of mcpTools) out.push({ name: `mcp-${t.name}`, schema: t.inputSchema, tool: { name: t.name, parameters: t.inputSchema } });
  return out;
}

function clean(schema) {
  return JSON.parse(JSON.stringify(schema));  // drops undefined fields
}

export function allSchemas() {
  const base = [...toolEntries(), ...structures].map((e) => ({ ...e, schema: clean(e.schema) }));
  const out = [...base];
  // Variants: nullable, wrapped in a one-or-two-item array, and under a required property.
  for (const e of base) {
    const s = e.schema;
    out.push({ name: `${e.name}/nullable`, schema: { anyOf: [s, { type: "null" }], ...(s.$defs ? { $defs: s.$defs } : {}), ...(s.definitions ? { definitions: s.definitions } : {}) } });
  }
  for (const e of base) {
    if (JSON.stringify(e.schema).includes('"$ref"')) continue;  // references are relative to the root
    out.push({ name: `${e.name}/in-array`, schema: { type: "array", items: e.schema, minItems: 1, maxItems: 2 } });
    out.push({ name: `${e.name}/wrapped`, schema: { type: "object", properties: { result: e.schema, ok: { type: "boolean" } }, required: ["result", "ok"], additionalProperties: false } });
  }
  return out;
}

export function allTools() {
  return toolEntries().map((e) => e.tool);
}

// Regexes (whole-output match) and GBNF grammars with a JavaScript check of their language.
export const regexes = [
  "[a-z]{3,8}",
  "(yes|no|maybe)",
  "\\d{3}-\\d{4}",
  "[A-Z][a-z]+ [A-Z][a-z]+",
  "(?:[01]\\d|2[0-3]):[0-5]\\d",
  "#[0-9a-f]{6}",
  "\\w+@\\w+\\.(com|org)",
  "-?\\d+(\\.\\d{1,2})?",
  "[^\\n]{1,20}",
  "(ab|cd)+e?",
  "[α-ω]{2,4}",
  "\\[\\d+(, \\d+){0,3}\\]",
];

export const grammars = [
  { gbnf: 'root ::= "(" item (" " item)* ")"\nitem ::= [a-z]+ | root', check: (t) => /^\([a-z() ]+\)$/.test(t) && balanced(t) },
  { gbnf: 'root ::= digit{2,4} "-" ("x" | "y")?\ndigit ::= [0-9]', check: (t) => /^[0-9]{2,4}-[xy]?$/.test(t) },
  { gbnf: '# booleans\nroot ::= ("true" | "false") ("," ws ("true" | "false"))*\nws ::= " "?', check: (t) => /^(true|false)(, ?(true|false))*$/.test(t) },
  { gbnf: 'root ::= [^"\\n]+ "!"', check: (t) => /^[^"\n]+!$/.test(t) },
];

function balanced(t) {
  let d = 0;
  for (const c of t) {
    if (c === "(") d++;
    if (c === ")" && --d < 0) return false;
  }
  return d === 0;
}
