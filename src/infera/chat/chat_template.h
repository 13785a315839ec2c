// Chat templates: the Jinja template in a model's tokenizer_config.json that turns a
// conversation (messages, tools, ...) into the prompt text the model was trained on.
//
// Rendering is a sandboxed Jinja subset (tokenizer -> parser -> AST -> evaluator, see
// jinja_*.h): no file, network or Python access; a template can only compute text from
// the context it is given. The output is byte-identical to @huggingface/jinja (the
// renderer of transformers.js and the Hub), checked by tests/conformance/chat_template.mjs
// on the Qwen3, Qwen3.5, Llama 3 and DeepSeek-R1 templates. Like that reference (and
// transformers), whitespace control is trim_blocks + lstrip_blocks, `{{ true }}` prints
// "true", `{{ none }}` prints nothing and dicts print as JSON.
//
// Deliberate differences from the reference, where it lacks Python Jinja behaviour:
//   - strip/lstrip/rstrip(chars) strip those characters (the reference ignores the argument
//     and strips whitespace);
//   - output written before {% break %} / {% continue %} is kept, and a for-else block
//     renders only when there was nothing to loop over;
//   - looping over undefined loops zero times, looping over a string yields characters;
//   - extra filters, tests and methods: count, select/reject, map('filter'), sum, round,
//     escape, wordcount, list/first/last/reverse on strings, `is in/ne/gt/divisibleby(n)`,
//     str.find/count/join, string < string, string * int, default without parentheses.
// Case mapping (upper/lower) is Unicode's simple mapping, one code point to one, but for
// "ß".upper() = "SS" (the reference's full mapping differs only for rarer characters such as
// ligatures); title() upper-cases ASCII word starts, as the reference does.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace infera {

namespace jinja {
struct Program;
}

class ChatTemplate {
 public:
  // Parses once. Throws infera::Error "chat template: line L, column C: <problem>" on a
  // syntax error, so a bad template is a start-up error naming the line.
  explicit ChatTemplate(std::string source);

  // context: a JSON object whose keys become template variables: messages, tools,
  // add_generation_prompt, bos_token, eos_token, enable_thinking, and whatever else the
  // caller passes. Throws infera::Error on a render error: "chat template: line L, column
  // C: <problem>", or "chat template: <message>" when the template calls raise_exception.
  // Thread-safe (const), any number of renders in parallel.
  //
  // Pass ordered_json to keep the caller's key order (tools' JSON schemas are printed
  // with tojson, so key order is visible in the prompt); plain json sorts keys.
  std::string render(const nlohmann::ordered_json& context) const;
  std::string render(const nlohmann::json& context) const;

  const std::string& source() const { return source_; }

 private:
  std::string source_;
  std::shared_ptr<const jinja::Program> program_;
};

// What a chat template needs from a Hugging Face tokenizer directory.
struct ChatTemplateConfig {
  std::string chat_template;  // "" when the directory has none
  std::optional<std::string> bos_token;  // unset when absent or null
  std::optional<std::string> eos_token;
};

// Reads dir/tokenizer_config.json: chat_template (a string, or a list of {name, template}
// of which "default" is taken), bos_token / eos_token (strings or {"content": ...}). When
// the config has no template, chat_template.jinja or chat_template.json beside it (newer
// transformers) is used. Throws infera::Error naming the file on a missing file or bad JSON.
ChatTemplateConfig load_chat_template_config(const std::string& tokenizer_dir);

}  // namespace infera
