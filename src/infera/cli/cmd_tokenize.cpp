// `infera tokenize`: text -> token ids, or (--decode) ids -> text, with the tokenizer of a
// Hugging Face directory (tokenizer.json + tokenizer_config.json).
//
//   infera tokenize --tokenizer DIR "text"          prints [id, ...]
//   echo -n "text" | infera tokenize --tokenizer DIR
//   infera tokenize --tokenizer DIR --decode "[1, 2, 3]"
//   infera tokenize --tokenizer DIR --jsonl < strings.jsonl   one JSON string per line in,
//                                                           one JSON id array per line out
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "infera/base/error.h"
#include "infera/base/text_file.h"
#include "infera/cli/command.h"
#include "infera/cli/model_paths.h"
#include "infera/tokenizer/tokenizer.h"

namespace {

struct Options {
  std::string tokenizer_dir;
  std::string input;
  bool has_input = false;
  bool decode = false;
  bool no_special = false;
  bool skip_special = false;
  bool jsonl = false;
};

std::string ids_to_json(const std::vector<int32_t>& ids) {
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(ids[i]);
  }
  return out + "]";
}

std::vector<int32_t> parse_ids(const std::string& text, const std::string& where) {
  nlohmann::json parsed;
  try {
    parsed = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    infera::fail("{}: expected a JSON array of token ids: {}", where, e.what());
  }
  if (!parsed.is_array()) infera::fail("{}: expected a JSON array of token ids, got {}", where, parsed.type_name());
  std::vector<int32_t> ids;
  for (const auto& value : parsed) {
    if (!value.is_number_integer()) infera::fail("{}: token ids must be integers, got {}", where, value.dump());
    ids.push_back(value.get<int32_t>());
  }
  return ids;
}

int run(const Options& opts) {
  const infera::Tokenizer tokenizer = infera::Tokenizer::load(opts.tokenizer_dir);
  const bool add_special = !opts.no_special;
  if (opts.jsonl) {
    // Batch mode: many strings through one loaded tokenizer.
    std::string line;
    size_t line_number = 0;
    while (std::getline(std::cin, line)) {
      ++line_number;
      if (line.empty()) continue;
      const std::string where = "stdin line " + std::to_string(line_number);
      if (opts.decode) {
        const std::string text = tokenizer.decode(parse_ids(line, where), opts.skip_special);
        std::cout << nlohmann::json(text).dump() << '\n';
      } else {
        nlohmann::json parsed;
        try {
          parsed = nlohmann::json::parse(line);
        } catch (const nlohmann::json::parse_error& e) {
          infera::fail("{}: expected a JSON string: {}", where, e.what());
        }
        if (!parsed.is_string()) infera::fail("{}: expected a JSON string, got {}", where, parsed.type_name());
        std::cout << ids_to_json(tokenizer.encode(parsed.get<std::string>(), add_special)) << '\n';
      }
    }
    std::cout.flush();
    return 0;
  }
  std::string input = opts.input;
  if (!opts.has_input) input = infera::read_standard_input("the text or ids");
  if (opts.decode) {
    const std::string text = tokenizer.decode(parse_ids(input, opts.has_input ? "ids" : "stdin"), opts.skip_special);
    std::cout << text;
    if (isatty(STDOUT_FILENO)) std::cout << '\n';  // exact text when piped
  } else {
    std::cout << ids_to_json(tokenizer.encode(input, add_special)) << '\n';
  }
  std::cout.flush();
  return 0;
}

void setup(CLI::App& app) {
  auto* cmd = app.add_subcommand("tokenize", "Turn text into token ids (or --decode ids into text)");
  auto opts = std::make_shared<Options>();
  cmd->add_option("--tokenizer", opts->tokenizer_dir,
                  "Directory with tokenizer.json and tokenizer_config.json, a GGUF file, ollama:NAME or hf:ORG/NAME")
      ->required()
      ->transform(infera::cli::model_ref_transform());
  cmd->add_option("input", opts->input,
                  "Text to encode, or with --decode a JSON array of ids (default: read all of stdin)");
  cmd->add_flag("--decode", opts->decode, "Decode a JSON array of token ids into text");
  cmd->add_flag("--no-special", opts->no_special, "Encode without the BOS/EOS tokens the tokenizer adds");
  cmd->add_flag("--skip-special", opts->skip_special, "Decode: leave special tokens out of the text");
  cmd->add_flag("--jsonl", opts->jsonl,
                "Batch mode: stdin has one JSON string per line (with --decode: one id array per line); "
                "stdout gets one JSON id array (with --decode: one JSON string) per line");
  cmd->callback([opts, cmd] {
    opts->has_input = cmd->count("input") > 0;
    if (opts->jsonl && opts->has_input) infera::fail("tokenize: --jsonl reads stdin; do not pass text too");
    infera::cli::set_exit_code(run(*opts));
  });
}

}  // namespace

INFERA_REGISTER_COMMAND(tokenize, setup);
