// Where the model of a command comes from: the built-in default model when no -m is given,
// and models named in other tools' stores.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace infera::cli {

// INFERA_DEFAULT_MODEL if set, else models/infera-default found beside (or above) the
// directory of the running executable. Throws infera::Error with a hint when absent.
std::string default_model_dir();
// The same before a store reference in INFERA_DEFAULT_MODEL is resolved (`serve` resolves it
// with the deployment's models, keeping what the reference brings besides the path).
std::string default_model_ref();

// A CLI11 transform for the options that name a model (-m, a command's MODEL_DIR): a model in
// Ollama's store or the Hugging Face cache (ollama:NAME[:TAG], hf:ORG/NAME[@REV][:QUANT];
// io/model_ref.h) becomes its file or directory; any other value passes as it is. A
// reference that does not resolve is the option's error. `ollama_params`, when given, gets an
// ollama: model's params layer (its sampling defaults; "" for any other value).
CLI::Validator model_ref_transform(std::string* ollama_params = nullptr);

}  // namespace infera::cli
