// The constraint compilers, the matcher (accept, rollback, completion cost) and the token
// mask against a brute-force reference (every token's bytes tried on the matcher).
#include <gtest/gtest.h>

#include <random>

#include "infera/constrain/compile.h"
#include "infera/constrain/constraint.h"
#include "infera/constrain/matcher.h"

namespace infera::constrain {
namespace {

using nlohmann::json;

bool matches(const Grammar& g, std::string_view text) {
  Matcher m(std::make_shared<const Grammar>(g));
  return m.accept(text) && m.complete();
}

bool prefix_ok(const Grammar& g, std::string_view text) {
  Matcher m(std::make_shared<const Grammar>(g));
  return m.accept(text);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConstraintError& e) {
    return e.what();
  }
  return "";
}

TEST(ConstrainRegex, MatchesAndRejects) {
  const Grammar g = compile_regex("^[a-c]+(x|yz)?\\d{2,3}$");
  EXPECT_TRUE(matches(g, "abc12"));
  EXPECT_TRUE(matches(g, "ayz123"));
  EXPECT_FALSE(matches(g, "ayz1234"));
  EXPECT_FALSE(matches(g, "d12"));
  EXPECT_FALSE(matches(g, "a1"));
  EXPECT_TRUE(prefix_ok(g, "a"));
  const Grammar any = compile_regex("(?:\\w+\\s?){1,3}\\.");
  EXPECT_TRUE(matches(any, "hello world."));
  EXPECT_FALSE(matches(any, "a b c d."));
  const Grammar uni = compile_regex("[α-ω]{2}é.");
  EXPECT_TRUE(matches(uni, "αβé😀"));
  EXPECT_FALSE(matches(uni, "abé!"));
  const Grammar neg = compile_regex("[^a]");
  EXPECT_TRUE(matches(neg, "€"));
  EXPECT_FALSE(matches(neg, "a"));
  EXPECT_FALSE(matches(neg, "\xC3"));  // a lone lead byte is not a character
}

TEST(ConstrainRegex, UnsupportedConstructsNamePosition) {
  EXPECT_NE(error_of([] { compile_regex("ab(?=c)"); }).find("lookaround at position 2"), std::string::npos);
  EXPECT_NE(error_of([] { compile_regex("(a)\\1"); }).find("backreference at position 3"), std::string::npos);
  EXPECT_NE(error_of([] { compile_regex("a\\bc"); }).find("position 1"), std::string::npos);
  EXPECT_NE(error_of([] { compile_regex("a(b"); }).find("unterminated group"), std::string::npos);
  EXPECT_NE(error_of([] { compile_regex("*a"); }).find("nothing to repeat"), std::string::npos);
  EXPECT_NE(error_of([] { compile_regex("a^b"); }).find("'^'"), std::string::npos);
  // Nesting is bounded before it can exhaust the stack; a nesting within the bound compiles.
  EXPECT_NE(error_of([] {
              compile_regex(std::string(200000, '(') + "a" + std::string(200000, ')'));
            }).find("nested more than 256 deep"),
            std::string::npos);
  EXPECT_NO_THROW(compile_regex(std::string(256, '(') + "a" + std::string(256, ')')));
}

TEST(ConstrainChoice, ExactlyOne) {
  const Grammar g = compile_choice({"yes", "no", "maybe so"});
  EXPECT_TRUE(matches(g, "no"));
  EXPECT_TRUE(matches(g, "maybe so"));
  EXPECT_FALSE(matches(g, "nope"));
  EXPECT_FALSE(matches(g, "maybe"));
}

TEST(ConstrainGbnf, ParsesLlamaCppGrammars) {
  const Grammar g = compile_gbnf(R"g(
    # arithmetic
    root ::= expr
    expr ::= term ([-+*/] term)*
    term ::= num | "(" expr ")"
    num  ::= [0-9]+ ("." [0-9]{1,3})?
  )g");
  EXPECT_TRUE(matches(g, "1+(2*3.25)/4"));
  EXPECT_FALSE(matches(g, "1+"));
  EXPECT_FALSE(matches(g, "(1"));
  EXPECT_FALSE(matches(g, "1.2345"));
  const Grammar s = compile_gbnf("root ::= \"\\u00e9\" [^\\n\"]* \"!\"\n");
  EXPECT_TRUE(matches(s, "é abc!"));
  EXPECT_FALSE(matches(s, "é a\nb!"));
}

TEST(ConstrainGbnf, ErrorsNameTheRuleOrPosition) {
  EXPECT_NE(error_of([] { compile_gbnf("root ::= foo"); }).find("'foo'"), std::string::npos);
  EXPECT_NE(error_of([] { compile_gbnf("start ::= \"a\""); }).find("no 'root'"), std::string::npos);
  EXPECT_NE(error_of([] { compile_gbnf("root ::= root \"a\" | \"b\""); }).find("left-recursive"), std::string::npos);
  EXPECT_NE(error_of([] {
              compile_gbnf("root ::= " + std::string(200000, '(') + "\"a\"" + std::string(200000, ')'));
            }).find("nested more than 256 deep"),
            std::string::npos);
  EXPECT_NO_THROW(compile_gbnf("root ::= " + std::string(256, '(') + "\"a\"" + std::string(256, ')')));
  EXPECT_NE(error_of([] { compile_gbnf("root ::= \"a\nroot2 ::= x"); }).find("line 1"), std::string::npos);
  EXPECT_NE(error_of([] { compile_gbnf("root ::= \"a\" x\nx ::= \"b\" x"); }).find("never ends"), std::string::npos);
}

TEST(ConstrainJsonSchema, ObjectsWithRequiredAndOptional) {
  const json schema = json::parse(R"({
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 5}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
                   "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
    "required": ["name"], "additionalProperties": false})");
  const Grammar g = compile_json_schema(schema);
  EXPECT_TRUE(matches(g, R"({"name":"bob"})"));
  EXPECT_TRUE(matches(g, R"({"age":7,"name":"bob","tags":["a","b"]})"));
  EXPECT_TRUE(matches(g, R"({"age":120,"name":""})"));
  EXPECT_FALSE(matches(g, R"({"age":121,"name":"x"})"));
  EXPECT_FALSE(matches(g, R"({"age":7})"));
  EXPECT_FALSE(matches(g, R"({"name":"toolong"})"));
  EXPECT_FALSE(matches(g, R"({"name":"x","tags":["a","b","a"]})"));
  EXPECT_FALSE(matches(g, R"({"name":"x","other":1})"));
  EXPECT_FALSE(matches(g, R"({"name":"x",})"));
}

TEST(ConstrainJsonSchema, RecursionRefsAndCombinators) {
  const json schema = json::parse(R"({
    "$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
                       "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["v"]}},
    "anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]})");
  const Grammar g = compile_json_schema(schema);
  EXPECT_TRUE(matches(g, R"({"kids":[{"v":2},{"kids":[],"v":-3}],"v":1})"));
  EXPECT_TRUE(matches(g, "null"));
  EXPECT_FALSE(matches(g, R"({"kids":[{}],"v":1})"));
  const json all = json::parse(R"({"allOf": [{"type":"object","properties":{"a":{"type":"string"}},"required":["a"]},
                                             {"properties":{"b":{"type":"boolean"}},"required":["b"]}],
                                   "additionalProperties": false})");
  const Grammar ga = compile_json_schema(all);
  EXPECT_TRUE(matches(ga, R"({"a":"x","b":true})"));
  EXPECT_FALSE(matches(ga, R"({"a":"x"})"));
}

// Properties are written in the order the schema declares them (the schema is taken as
// ordered_json); required keys that 'properties' lacks follow in the order 'required' lists them.
TEST(ConstrainJsonSchema, PropertiesInDeclaredOrder) {
  using ojson = nlohmann::ordered_json;
  const ojson schema = ojson::parse(R"({"type":"object","properties":{"zeta":{"type":"integer"},
    "alpha":{"type":"string"},"mid":{"type":"boolean"}},"required":["mid","zeta","alpha"],"additionalProperties":false})");
  ASSERT_EQ(schema["properties"].begin().key(), "zeta");
  const Grammar g = compile_json_schema(schema);
  EXPECT_TRUE(matches(g, R"({"zeta":1,"alpha":"a","mid":true})"));
  EXPECT_FALSE(matches(g, R"({"alpha":"a","mid":true,"zeta":1})"));  // the sorted order
  EXPECT_FALSE(matches(g, R"({"mid":true,"zeta":1,"alpha":"a"})"));  // the order of 'required'
  // Optional properties keep their place; required ones cannot be left out.
  const Grammar o = compile_json_schema(ojson::parse(
      R"({"type":"object","properties":{"b":{"type":"integer"},"a":{"type":"integer"},"c":{"type":"integer"}},
          "required":["c"],"additionalProperties":false})"));
  EXPECT_TRUE(matches(o, R"({"b":1,"a":2,"c":3})"));
  EXPECT_TRUE(matches(o, R"({"a":2,"c":3})"));
  EXPECT_TRUE(matches(o, R"({"c":3})"));
  EXPECT_FALSE(matches(o, R"({"a":2,"b":1,"c":3})"));
  EXPECT_FALSE(matches(o, R"({"b":1,"a":2})"));
  // Required keys outside 'properties' (with additionalProperties) in the order listed.
  const Grammar r =
      compile_json_schema(ojson::parse(R"({"type":"object","required":["y","x"],"additionalProperties":true})"));
  EXPECT_TRUE(matches(r, R"({"y":1,"x":2})"));
  EXPECT_FALSE(matches(r, R"({"x":2,"y":1})"));
  // Nested objects, tool arguments and the cache key keep the order too.
  const Grammar n = compile_json_schema(ojson::parse(R"({"type":"object","properties":{"outer":{"type":"object",
    "properties":{"q":{"type":"integer"},"p":{"type":"integer"}},"required":["q","p"]}},"required":["outer"]})"));
  EXPECT_TRUE(matches(n, R"({"outer":{"q":1,"p":2}})"));
  EXPECT_FALSE(matches(n, R"({"outer":{"p":2,"q":1}})"));
  const Grammar t = compile_tool_calls(
      {{"f", ojson::parse(R"({"type":"object","properties":{"to":{"type":"string"},"body":{"type":"string"}},
                             "required":["to","body"]})")}},
      {});
  EXPECT_TRUE(
      matches(t, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"to\": \"a\", \"body\": \"b\"}}\n</tool_call>"));
  EXPECT_FALSE(
      matches(t, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"body\": \"b\", \"to\": \"a\"}}\n</tool_call>"));
  ConstraintSpec a, b;
  a.kind = b.kind = ConstraintSpec::Kind::kJsonSchema;
  a.json = ojson::parse(R"({"properties":{"x":{},"y":{}}})");
  b.json = ojson::parse(R"({"properties":{"y":{},"x":{}}})");
  EXPECT_NE(a.key(), b.key());
}

// oneOf compiles as anyOf (as llama.cpp's and xgrammar's converters do): exact where the
// alternatives cannot both hold (different types, different const / enum discriminators,
// objects without extra keys whose required properties differ).
TEST(ConstrainJsonSchema, OneOfOfDistinguishableAlternatives) {
  const Grammar tagged = compile_json_schema(json::parse(R"({"oneOf":[
    {"type":"object","properties":{"kind":{"const":"circle"},"r":{"type":"integer"}},"required":["kind","r"],
     "additionalProperties":false},
    {"type":"object","properties":{"kind":{"const":"square"},"side":{"type":"integer"}},"required":["kind","side"],
     "additionalProperties":false}]})"));
  EXPECT_TRUE(matches(tagged, R"({"kind":"circle","r":2})"));
  EXPECT_TRUE(matches(tagged, R"({"kind":"square","side":3})"));
  EXPECT_FALSE(matches(tagged, R"({"kind":"circle","side":3})"));
  EXPECT_FALSE(matches(tagged, R"({"kind":"square","r":2})"));
  const Grammar types = compile_json_schema(
      json::parse(R"({"oneOf":[{"type":"integer","maximum":9},{"type":"string","maxLength":2},{"type":"null"}]})"));
  EXPECT_TRUE(matches(types, "7"));
  EXPECT_TRUE(matches(types, R"("ab")"));
  EXPECT_TRUE(matches(types, "null"));
  EXPECT_FALSE(matches(types, "10"));
  EXPECT_FALSE(matches(types, "true"));
  // Sibling keywords apply to every alternative, as for anyOf.
  const Grammar shared = compile_json_schema(json::parse(R"({"type":"object","required":["id"],
    "properties":{"id":{"type":"integer"}},"oneOf":[{"properties":{"a":{"type":"string"}},"required":["a"]},
    {"properties":{"b":{"type":"boolean"}},"required":["b"]}],"additionalProperties":false})"));
  EXPECT_TRUE(matches(shared, R"({"id":1,"a":"x"})"));
  EXPECT_TRUE(matches(shared, R"({"id":1,"b":true})"));
  EXPECT_FALSE(matches(shared, R"({"id":1,"a":"x","b":true})"));
  EXPECT_FALSE(matches(shared, R"({"a":"x"})"));
}

TEST(ConstrainJsonSchema, FormatsPatternsNumbers) {
  EXPECT_TRUE(matches(compile_json_schema({{"type", "string"}, {"format", "date"}}), "\"2024-02-28\""));
  EXPECT_FALSE(matches(compile_json_schema({{"type", "string"}, {"format", "date"}}), "\"2024-02-30\""));
  EXPECT_TRUE(matches(compile_json_schema({{"type", "string"}, {"format", "date-time"}}), "\"2024-12-31T23:59:59Z\""));
  EXPECT_TRUE(matches(compile_json_schema({{"type", "string"}, {"format", "uuid"}}),
                      "\"123e4567-e89b-12d3-a456-426614174000\""));
  EXPECT_TRUE(matches(compile_json_schema({{"type", "string"}, {"format", "email"}}), "\"a.b@example.com\""));
  const Grammar p = compile_json_schema({{"type", "string"}, {"pattern", "^[A-Z]{2}-\\d+$"}});
  EXPECT_TRUE(matches(p, "\"AB-12\""));
  EXPECT_FALSE(matches(p, "\"AB-\""));
  const Grammar unanchored = compile_json_schema({{"type", "string"}, {"pattern", "ab"}});
  EXPECT_TRUE(matches(unanchored, "\"xxabyy\""));
  EXPECT_FALSE(matches(unanchored, "\"xxa\""));
  const Grammar quote = compile_json_schema({{"type", "string"}, {"pattern", "^a\"b$"}});
  EXPECT_TRUE(matches(quote, "\"a\\\"b\""));
  const Grammar ints = compile_json_schema({{"type", "integer"}, {"exclusiveMinimum", -15}, {"maximum", 1234}});
  for (int v : {-14, -1, 0, 9, 10, 99, 100, 999, 1000, 1234}) EXPECT_TRUE(matches(ints, std::to_string(v))) << v;
  for (int v : {-15, -16, 1235, 2000}) EXPECT_FALSE(matches(ints, std::to_string(v))) << v;
  EXPECT_FALSE(matches(ints, "007"));
  const Grammar num = compile_json_schema({{"type", "number"}, {"minimum", 0}, {"maximum", 1}});
  EXPECT_TRUE(matches(num, "0.25"));
  EXPECT_TRUE(matches(num, "1"));
  EXPECT_FALSE(matches(num, "1.5"));
  EXPECT_FALSE(matches(num, "-0.5"));
}

TEST(ConstrainJsonSchema, UnsupportedKeywordsAreNamed) {
  EXPECT_NE(error_of([] {
              compile_json_schema({{"type", "object"}, {"patternProperties", json::object()}});
            }).find("'patternProperties'"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              compile_json_schema({{"type", "string"}, {"format", "ipv6"}});
            }).find("'ipv6'"),
            std::string::npos);
  EXPECT_NE(error_of([] { compile_json_schema({{"not", json::object()}}); }).find("'not'"), std::string::npos);
  EXPECT_NE(error_of([] { compile_json_schema({{"$ref", "#/nowhere"}}); }).find("does not resolve"), std::string::npos);
  EXPECT_NE(error_of([] {
              compile_json_schema({{"type", "string"}, {"pattern", "(?=x)"}});
            }).find("#/pattern"),
            std::string::npos);
}

TEST(ConstrainToolCalls, QwenFormat) {
  const Grammar g = compile_tool_calls(
      {{"get_weather", json::parse(R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]})")},
       {"noop", json::object()}},
      {});
  EXPECT_TRUE(
      matches(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}\n</tool_call>"));
  EXPECT_TRUE(matches(g,
                      "<tool_call>\n{\"name\": \"noop\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": "
                      "\"noop\", \"arguments\": {\"x\":[1]}}\n</tool_call>"));
  EXPECT_FALSE(matches(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>"));
  ToolCallOptions after_tag;
  after_tag.with_open_tag = false;
  after_tag.parallel = false;
  const Grammar a = compile_tool_calls({{"noop", json::object()}}, after_tag);
  EXPECT_TRUE(matches(a, "\n{\"name\": \"noop\", \"arguments\": {}}\n</tool_call>"));
}

TEST(ConstrainMatcher, RollbackAndCost) {
  auto g = std::make_shared<const Grammar>(compile_json_schema(
      json::parse(R"({"type":"object","properties":{"k":{"type":"string","minLength":3}},"required":["k"]})")));
  Matcher m(g);
  EXPECT_EQ(m.min_remaining(), std::string(R"({"k":"aaa"})").size());
  ASSERT_TRUE(m.accept("{\"k"));
  ASSERT_TRUE(m.accept("\":\"a"));
  EXPECT_EQ(m.min_remaining(), 4u);  // aa"}
  EXPECT_FALSE(m.accept("\x01"));  // a control character inside a string
  EXPECT_EQ(m.depth(), 2u);
  m.rollback(1);
  EXPECT_EQ(m.min_remaining(), 8u);  // ":"aaa"}
  ASSERT_TRUE(m.accept("\":\"abc\"}"));
  EXPECT_TRUE(m.complete());
  EXPECT_FALSE(m.can_continue());
  m.rollback(5);
  EXPECT_EQ(m.depth(), 0u);
  EXPECT_FALSE(m.complete());
}

// A synthetic byte-level vocabulary: every single byte and random strings drawn from JSON-ish text.
std::shared_ptr<const Vocabulary> test_vocab(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  const std::string alphabet = "{}[]\":,. -_0123456789abcdefgnrtuxyzAEZ\\\n\xC3\xA9";
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.emplace_back(1, static_cast<char>(b));
  while (tokens.size() < n) {
    std::string t;
    const int len = 2 + static_cast<int>(rng() % 6);
    for (int k = 0; k < len; ++k) t += alphabet[rng() % alphabet.size()];
    tokens.push_back(t);
  }
  tokens.push_back("\"name\"");
  tokens.push_back("");  // an empty token is never allowed
  std::vector<char> usable(tokens.size(), 1);
  usable[10] = 0;  // an unusable (special) token
  return std::make_shared<const Vocabulary>(std::move(tokens), std::move(usable));
}

// Checks, on the states of a random walk over allowed tokens, the whole-trie walk
// (Matcher::fill_mask), the context-independent token sets with the context-dependent
// tokens checked against the state (CompiledConstraint::compute_mask, every mask computed)
// and the cached path with a budget (CompiledConstraint::mask) against trying every token.
void check_masks_against_brute_force(const Grammar& grammar, uint32_t seed,
                                     std::shared_ptr<const Vocabulary> vocab = nullptr) {
  auto g = std::make_shared<const Grammar>(grammar);
  if (!vocab) vocab = test_vocab(3000, seed);
  const CompiledConstraint compiled(g, vocab);
  std::mt19937 rng(seed);
  Matcher m(g);
  std::vector<uint64_t> mask(vocab->mask_words()), sets(vocab->mask_words()), cached(vocab->mask_words());
  for (int step = 0; step < 40; ++step) {
    for (uint32_t budget :
         {Grammar::kInfinite, 1 + static_cast<uint32_t>(rng() % 30), 30 + static_cast<uint32_t>(rng() % 200)}) {
      const int64_t n = m.fill_mask(*vocab, mask.data(), budget);
      int64_t n_sets = -1;
      uint32_t max_cost = 0;
      if (budget == Grammar::kInfinite) n_sets = compiled.compute_mask(m, sets.data(), &max_cost);
      const int64_t n_cached = compiled.mask(m, cached.data(), budget);
      int64_t count = 0;
      uint32_t most = 0;
      std::vector<int32_t> allowed;
      for (int32_t t = 0; t < vocab->size(); ++t) {
        bool ok = vocab->usable(t) && !vocab->bytes(t).empty() && m.accept(vocab->bytes(t));
        if (ok) {
          most = std::max(most, m.min_remaining());
          if (budget < Grammar::kInfinite) ok = m.min_remaining() + 1 <= budget;
          m.rollback(1);
        }
        const bool bit = (mask[t >> 6] >> (t & 63)) & 1;
        ASSERT_EQ(bit, ok) << "token " << t << " '" << vocab->bytes(t) << "' step " << step << " budget " << budget;
        if (budget == Grammar::kInfinite) {
          ASSERT_EQ((sets[t >> 6] >> (t & 63)) & 1, ok ? 1u : 0u)
              << "token sets: token " << t << " '" << vocab->bytes(t) << "' step " << step;
        }
        ASSERT_EQ((cached[t >> 6] >> (t & 63)) & 1, ok ? 1u : 0u)
            << "cached: token " << t << " '" << vocab->bytes(t) << "' step " << step << " budget " << budget;
        count += ok;
        if (ok && budget == Grammar::kInfinite) allowed.push_back(t);
      }
      EXPECT_EQ(n, count);
      EXPECT_EQ(n_cached, count);
      if (budget == Grammar::kInfinite) {
        EXPECT_EQ(n_sets, count);
        EXPECT_GE(max_cost, most);  // an upper bound of the costs after the allowed tokens
      }
      if (budget == Grammar::kInfinite) {
        if (allowed.empty()) return;
        ASSERT_TRUE(m.accept(vocab->bytes(allowed[rng() % allowed.size()])));
        break;
      }
    }
  }
}

TEST(ConstrainMask, MatchesBruteForceOnRandomStates) {
  check_masks_against_brute_force(compile_json_object(), 1);
  check_masks_against_brute_force(compile_json_schema(
                                      json::parse(R"({"type":"object","properties":{"name":{"type":"string"},
        "n":{"type":"integer","minimum":-5,"maximum":300},"l":{"type":"array","items":{"type":"boolean"}}},
        "required":["name"]})")),
                                  2);
  check_masks_against_brute_force(compile_regex("[a-f]{3,}(-[0-9]+)*x?"), 3);
  check_masks_against_brute_force(compile_gbnf("root ::= (\"{\" root \"}\" | [a-z])+"), 4);
  JsonSchemaOptions pretty;
  pretty.any_whitespace = true;
  check_masks_against_brute_force(compile_json_schema(json::parse(R"({"type":"array","items":{"type":"number"}})"),
                                                      pretty),
                                  5);
  // The vocabulary's own strings as choices: each trie node on a choice's path is a state of
  // its own, thousands of them (past the walk's transition table, the rest in its hash map).
  const auto vocab = test_vocab(3000, 6);
  std::vector<std::string> choices;
  for (int32_t t = 256; t < 656; ++t) choices.push_back(vocab->bytes(t) + vocab->bytes(t) + "!");
  check_masks_against_brute_force(compile_choice(choices), 6);
  // Recursion through $ref, strings in nested objects and pretty whitespace: tops in many
  // contexts, several tops per state, tokens that close a string and go on in the context.
  check_masks_against_brute_force(
      compile_json_schema(json::parse(R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"string"},
        "c":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v"]}},"$ref":"#/$defs/node"})"),
                          pretty),
      7);
  check_masks_against_brute_force(compile_gbnf(R"(root ::= item ("," item)*
item ::= [a-z]+ | "[" root "]" | "\"" [^"]* "\"")"),
                                  8);
}

// Two schemas on one vocabulary: the second finds the token sets of its strings (same
// canonical text) in the process-wide cache, and its masks still match trying every token.
TEST(ConstrainMask, TokenSetsSharedBetweenConstraints) {
  auto vocab = test_vocab(3000, 21);
  check_masks_against_brute_force(compile_json_schema(json::parse(
                                      R"({"type":"object","properties":{"a":{"type":"string"},"b":{"type":"string"}},
        "required":["a","b"]})")),
                                  21, vocab);
  const int64_t hits = top_token_cache_stats().hits;
  check_masks_against_brute_force(compile_json_schema(
                                      json::parse(R"({"type":"object","properties":{"name":{"type":"string"},
        "n":{"type":"integer"}},"required":["name","n"]})")),
                                  22, vocab);
  EXPECT_GT(top_token_cache_stats().hits, hits);
}

TEST(ConstrainCache, SameSpecSameCompiledConstraint) {
  auto vocab = test_vocab(400, 9);
  ConstraintSpec spec;
  spec.kind = ConstraintSpec::Kind::kRegex;
  spec.text = "abc|def";
  auto a = compile_cached(spec, vocab);
  auto b = compile_cached(spec, vocab);
  EXPECT_EQ(a.get(), b.get());
  spec.text = "abd";
  EXPECT_NE(compile_cached(spec, vocab).get(), a.get());
  Matcher m(a->grammar());
  std::vector<uint64_t> mask(vocab->mask_words()), again(vocab->mask_words());
  const int64_t n = a->mask(m, mask.data());
  EXPECT_EQ(a->mask(m, again.data()), n);  // the cached copy
  EXPECT_EQ(mask, again);
}

}  // namespace
}  // namespace infera::constrain

namespace infera::constrain {
namespace {

// With the budget mask at every step, a random walk over allowed tokens ends complete
// within the budget (one token kept for the stop token, as the engine does).
TEST(ConstrainMask, BudgetSteeringCompletesInTime) {
  auto vocab = test_vocab(2000, 11);
  const std::vector<Grammar> grammars = {
      compile_gbnf("root ::= (\"true\" | \"false\") (\",\" ws (\"true\" | \"false\"))*\nws ::= \" \"?"),
      compile_gbnf("root ::= [^\"\\n]+ \"!\""),
      compile_json_object(),
  };
  std::mt19937 rng(5);
  std::vector<uint64_t> mask(vocab->mask_words());
  for (size_t gi = 0; gi < grammars.size(); ++gi) {
    auto g = std::make_shared<const Grammar>(grammars[gi]);
    for (int trial = 0; trial < 20; ++trial) {
      Matcher m(g);
      const int max_tokens = 12 + trial;
      int used = 0;
      for (; used < max_tokens - 1; ++used) {
        const uint32_t room = static_cast<uint32_t>(max_tokens - used - 1);
        if (m.complete() && rng() % 4 == 0) break;
        const int64_t n = m.fill_mask(*vocab, mask.data(), room);
        if (n == 0 && m.complete()) break;  // only the stop token fits
        ASSERT_GT(n, 0) << "grammar " << gi << " trial " << trial << " step " << used << " cost " << m.min_remaining();
        std::vector<int32_t> allowed;
        for (int32_t t = 0; t < vocab->size(); ++t)
          if ((mask[t >> 6] >> (t & 63)) & 1) allowed.push_back(t);
        ASSERT_TRUE(m.accept(vocab->bytes(allowed[rng() % allowed.size()])));
      }
      EXPECT_TRUE(m.complete()) << "grammar " << gi << " trial " << trial;
    }
  }
}

}  // namespace
}  // namespace infera::constrain
