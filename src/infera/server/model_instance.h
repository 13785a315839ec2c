// One served model: its deployment settings, tokenizer, chat template and (once loaded)
// its generation backend. Models load in the background after the server is listening;
// /ready and /v1/models report each one's state, and one model failing leaves the others
// serving.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "infera/base/load_progress.h"
#include "infera/model/config.h"
#include "infera/runtime/engine_config.h"
#include "infera/server/backend.h"
#include "infera/server/deploy_config.h"
#include "infera/server/generation_defaults.h"
#include "infera/server/openai_api.h"
#include "infera/tokenizer/tokenizer.h"

namespace infera {
class ChatTemplate;
class Model;
struct LoadOptions;
}  // namespace infera

namespace infera::server {

enum class ModelState { kLoading, kReady, kFailed };

const char* model_state_name(ModelState s);  // "loading", "ready", "failed"

class ModelInstance {
 public:
  ModelInstance(ModelDeployConfig deploy, ModelConfig config, Tokenizer tokenizer,
                std::unique_ptr<ChatTemplate> chat_template, ResolvedLimits limits);
  ~ModelInstance();

  const std::string& name() const { return deploy_.name; }
  const ModelDeployConfig& deploy() const { return deploy_; }
  const ModelConfig& model_config() const { return config_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }
  const ResolvedLimits& limits() const { return limits_; }
  int64_t created_unix() const { return created_unix_; }

  ModelState state() const { return state_.load(); }
  // The backend while the model is ready (a failed engine turns the model "failed").
  std::shared_ptr<GenerationBackend> backend();
  void set_backend(std::shared_ptr<GenerationBackend> backend);  // -> ready
  void set_failed(const std::string& reason);  // logged, and shown only by the console's /v1/stats
  std::string failure() const;  // why the model failed ("" otherwise)
  // Seconds load() has taken so far (while loading) or took (once ready or failed); 0 before it starts.
  double load_seconds() const;
  // How far load() has come: the loader's steps (LoadOptions::progress) and then "starting"
  // the engine; fraction 1 once the model is ready.
  LoadProgress::Snapshot load_progress() const { return progress_->snapshot(); }

  // Loads the weights and starts the engine (blocking). Never throws: failure -> failed.
  void load();
  // How load() turns the weights directory into a Model (default: load_model). `infera
  // serve --tp` installs one that loads this rank's shard and drives the other ranks. It
  // reports progress through options.progress (plan its steps, then begin/advance/end).
  using ModelLoader = std::function<std::unique_ptr<Model>(const std::string& dir, const LoadOptions& options)>;
  void set_model_loader(ModelLoader loader) { model_loader_ = std::move(loader); }

  bool has_chat_template() const { return chat_template_ != nullptr; }
  // The model's sampling defaults for what a request leaves out (generation_defaults.h).
  const GenerationDefaults& generation_defaults() const { return generation_defaults_; }
  void set_generation_defaults(GenerationDefaults d) { generation_defaults_ = std::move(d); }
  // Renders the conversation for generation. Throws ApiException when the model has no
  // chat template or the template rejects the conversation (raise_exception).
  std::string render_chat(const ChatRequest& request) const;
  // Token positions in `ids` (the tokenized render_chat of `request`) where a message ends
  // and the conversation goes on identically in later requests: after the leading system
  // message, after the first `shared` messages (the model's own turns:
  // GenerationDefaults::apply_chat) and before the last message. Hints for the prefix
  // cache's state checkpoints (hybrid models); positions whose prefix does not tokenize as
  // `ids` starts are left out.
  std::vector<int32_t> message_boundaries(const ChatRequest& request, const std::vector<int32_t>& ids,
                                          size_t shared = 0) const;
  // The prefix cache keeps recurrent-state checkpoints (a hybrid model with prefix caching
  // on): message_boundaries() are worth computing.
  bool caches_state() const {
    return deploy_.enable_prefix_cache &&
           std::any_of(config_.layer_types.begin(), config_.layer_types.end(),
                       [](ModelConfig::LayerType t) { return t != ModelConfig::LayerType::kFullAttention; });
  }
  // The model writes <think>...</think> (its vocabulary has both as tokens).
  bool emits_reasoning() const { return emits_reasoning_; }
  // Token ids a request stops on besides the model's EOS ids (the engine adds those).
  const std::vector<int32_t>& extra_stop_ids() const { return extra_stop_ids_; }
  // The tokenizer's token bytes and their trie, for constrained decoding (built on first use).
  std::shared_ptr<const constrain::Vocabulary> vocabulary() const;

 private:
  // The chat template's input: `messages` with the request's tools and switches and the
  // tokenizer's BOS/EOS text.
  nlohmann::json template_context(const ChatRequest& request, const std::vector<ChatMessage>& messages,
                                  bool add_generation_prompt) const;

  ModelDeployConfig deploy_;
  ModelConfig config_;
  Tokenizer tokenizer_;
  std::unique_ptr<ChatTemplate> chat_template_;
  ResolvedLimits limits_;
  int64_t created_unix_ = 0;
  bool emits_reasoning_ = false;
  std::vector<int32_t> extra_stop_ids_;
  GenerationDefaults generation_defaults_;
  ModelLoader model_loader_;
  std::shared_ptr<LoadProgress> progress_ = std::make_shared<LoadProgress>();
  std::atomic<ModelState> state_{ModelState::kLoading};
  mutable std::mutex mutex_;
  std::shared_ptr<GenerationBackend> backend_;
  std::string failure_;
  std::chrono::steady_clock::time_point load_start_{}, load_end_{};
  mutable std::mutex vocab_mutex_;
  mutable std::shared_ptr<const constrain::Vocabulary> vocabulary_;
};

// Checks every model and server setting against the disk and this machine (paths,
// config.json, tokenizer, chat template, limits against the memory budget, ports) and
// returns the models with tokenizer and template loaded but no weights. Throws
// infera::Error listing every problem, one per line, each naming the field and the fix.
std::vector<std::shared_ptr<ModelInstance>> prepare_models(const DeployConfig& config);

// True when host:port can be bound now; else false with the reason.
bool port_available(const std::string& host, int port, std::string* why);

}  // namespace infera::server
