// `infera chat-template`: renders a conversation with a model's chat template.
//
//   infera chat-template --tokenizer DIR < conversation.json     prints the prompt text
//   infera chat-template --template FILE.jinja < conversation.json
//   infera chat-template --tokenizer DIR --jsonl < conversations.jsonl
//
// A conversation is a JSON object whose keys become template variables: messages,
// tools, add_generation_prompt, enable_thinking, ... bos_token / eos_token come from
// DIR/tokenizer_config.json unless the conversation sets them. In --jsonl mode each
// input line gives one output line: the prompt as a JSON string, or {"error": "..."}
// when that conversation fails (the exit code is then 1).
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "infera/base/error.h"
#include "infera/base/text_file.h"
#include "infera/chat/chat_template.h"
#include "infera/cli/command.h"
#include "infera/cli/model_paths.h"

namespace {

struct Options {
  std::string tokenizer_dir;
  std::string template_file;
  bool jsonl = false;
};

struct Renderer {
  std::optional<infera::ChatTemplate> chat_template;
  infera::ChatTemplateConfig config;

  std::string render(nlohmann::ordered_json context) const {
    if (!context.is_object()) infera::fail("a conversation must be a JSON object, got {}", context.type_name());
    if (config.bos_token && !context.contains("bos_token")) context["bos_token"] = *config.bos_token;
    if (config.eos_token && !context.contains("eos_token")) context["eos_token"] = *config.eos_token;
    return chat_template->render(context);
  }
};

Renderer load(const Options& opts) {
  if (opts.tokenizer_dir.empty() && opts.template_file.empty()) {
    infera::fail("chat-template needs --tokenizer DIR (with tokenizer_config.json) or --template FILE");
  }
  Renderer renderer;
  if (!opts.tokenizer_dir.empty()) renderer.config = infera::load_chat_template_config(opts.tokenizer_dir);
  std::string source = renderer.config.chat_template;
  if (!opts.template_file.empty()) {
    source = infera::read_text_file(opts.template_file, "the template (--template)");
  } else if (source.empty()) {
    infera::fail("{}/tokenizer_config.json has no chat_template; pass one with --template FILE", opts.tokenizer_dir);
  }
  renderer.chat_template.emplace(std::move(source));
  return renderer;
}

nlohmann::ordered_json parse_conversation(const std::string& text, const std::string& where) {
  try {
    return nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    infera::fail("{}: invalid JSON: {}", where, e.what());
  }
}

std::string dump_string(const std::string& text) {
  // Invalid UTF-8 from a template's slicing must not abort the batch.
  return nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

int run(const Options& opts) {
  const Renderer renderer = load(opts);
  if (!opts.jsonl) {
    const std::string input = infera::read_standard_input("the conversation");
    std::cout << renderer.render(parse_conversation(input, "stdin"));
    std::cout.flush();
    return 0;
  }
  int exit_code = 0;
  std::string line;
  size_t line_number = 0;
  while (std::getline(std::cin, line)) {
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      std::cout << dump_string(renderer.render(parse_conversation(line, "stdin line " + std::to_string(line_number))))
                << '\n';
    } catch (const infera::Error& e) {
      nlohmann::json error = {{"error", e.what()}};
      std::cout << error.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
      exit_code = 1;
    }
  }
  std::cout.flush();
  return exit_code;
}

void setup(CLI::App& app) {
  auto* cmd = app.add_subcommand("chat-template", "Render a conversation (JSON on stdin) with a chat template");
  auto opts = std::make_shared<Options>();
  cmd->add_option("--tokenizer", opts->tokenizer_dir,
                  "Directory with tokenizer_config.json (template, bos/eos tokens), a GGUF file, ollama:NAME or "
                  "hf:ORG/NAME")
      ->transform(infera::cli::model_ref_transform());
  cmd->add_option("--template", opts->template_file, "Jinja template file (overrides the directory's template)");
  cmd->add_flag("--jsonl", opts->jsonl, "One JSON conversation per input line, one JSON string per output line");
  cmd->callback([opts] { infera::cli::set_exit_code(run(*opts)); });
}

}  // namespace

INFERA_REGISTER_COMMAND(chat_template, setup);
