#include "infera/server/model_instance.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "infera/base/error.h"
#include "infera/base/log.h"
#include "infera/base/text_file.h"
#include "infera/base/threads.h"
#include "infera/chat/chat_template.h"
#include "infera/model/arch_registry.h"
#include "infera/model/gguf_loader.h"
#include "infera/model/kv_pool.h"
#include "infera/model/model.h"
#include "infera/model/weights.h"
#include "infera/runtime/disk_cache.h"
#include "infera/runtime/engine_config.h"

namespace infera::server {

namespace fs = std::filesystem;
using nlohmann::json;

const char* model_state_name(ModelState s) {
  switch (s) {
    case ModelState::kLoading: return "loading";
    case ModelState::kReady: return "ready";
    case ModelState::kFailed: return "failed";
  }
  return "unknown";
}

ModelInstance::ModelInstance(ModelDeployConfig deploy, ModelConfig config, Tokenizer tokenizer,
                             std::unique_ptr<ChatTemplate> chat_template, ResolvedLimits limits)
    : deploy_(std::move(deploy)),
      config_(std::move(config)),
      tokenizer_(std::move(tokenizer)),
      chat_template_(std::move(chat_template)),
      limits_(limits) {
  created_unix_ =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  emits_reasoning_ = tokenizer_.token_to_id("<think>").has_value() && tokenizer_.token_to_id("</think>").has_value();
  // Chat models end a turn with an end-of-turn token that is not always their EOS.
  for (const char* piece : {"<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>"}) {
    if (auto id = tokenizer_.token_to_id(piece); id && tokenizer_.is_special(*id)) extra_stop_ids_.push_back(*id);
  }
  if (tokenizer_.eos_id() >= 0) extra_stop_ids_.push_back(tokenizer_.eos_id());
}

ModelInstance::~ModelInstance() = default;

std::shared_ptr<GenerationBackend> ModelInstance::backend() {
  std::lock_guard lock(mutex_);
  if (backend_ && !backend_->healthy()) {
    LOG_ERROR("model '{}': the engine failed; the model no longer serves requests", name());
    backend_.reset();
    state_ = ModelState::kFailed;
  }
  return state_ == ModelState::kReady ? backend_ : nullptr;
}

void ModelInstance::set_backend(std::shared_ptr<GenerationBackend> backend) {
  std::lock_guard lock(mutex_);
  backend_ = std::move(backend);
  state_ = ModelState::kReady;
  load_end_ = std::chrono::steady_clock::now();
}

void ModelInstance::set_failed(const std::string& reason) {
  LOG_ERROR("model '{}' failed: {}", name(), reason);
  std::lock_guard lock(mutex_);
  backend_.reset();
  state_ = ModelState::kFailed;
  failure_ = reason;
  load_end_ = std::chrono::steady_clock::now();
}

std::string ModelInstance::failure() const {
  std::lock_guard lock(mutex_);
  if (state_ == ModelState::kFailed && failure_.empty()) return "the engine failed (see the server log)";
  return failure_;
}

double ModelInstance::load_seconds() const {
  std::lock_guard lock(mutex_);
  using std::chrono::steady_clock;
  if (load_start_ == steady_clock::time_point{}) return 0;
  const auto end = load_end_ == steady_clock::time_point{} ? steady_clock::now() : load_end_;
  return std::chrono::duration<double>(end - load_start_).count();
}

void ModelInstance::load() {
  {
    std::lock_guard lock(mutex_);
    load_start_ = std::chrono::steady_clock::now();
  }
  try {
    // This loading thread (weight conversion) and the engine's step loop use the model's
    // own thread count; other models keep theirs. The loader returns to the process-wide
    // count afterwards.
    set_thread_num_threads(deploy_.threads);
    struct ClearThreads {
      ~ClearThreads() { set_thread_num_threads(0); }
    } clear_threads;
    LoadOptions load_options;
    load_options.load_into_memory = deploy_.load_into_memory;
    load_options.max_batch_tokens = limits_.max_batch_tokens;
    load_options.progress = progress_;
    progress_->plan(1);  // "starting", after the loader's own steps
    const std::string dir = deploy_.quantized_path.empty() ? deploy_.path : deploy_.quantized_path;
    auto model = model_loader_ ? model_loader_(dir, load_options) : load_model(dir, load_options);
    progress_->begin("starting", 0);
    EngineConfig config = engine_config(deploy_, limits_);
    if (!deploy_.cache_dir.empty()) {
      config.cache_dir = deploy_.cache_dir;
      config.cache_disk_bytes = deploy_.cache_disk_bytes;
      config.cache_model_id = model_files_fingerprint(dir);
    }
    auto engine = std::make_unique<Engine>(std::move(model), std::move(config));
    progress_->end();
    set_backend(std::make_shared<EngineBackend>(std::move(engine)));
    LOG_INFO("model '{}' ready", name());
  } catch (const std::exception& e) {
    set_failed(e.what());
  }
}

std::shared_ptr<const constrain::Vocabulary> ModelInstance::vocabulary() const {
  std::lock_guard lock(vocab_mutex_);
  if (!vocabulary_) vocabulary_ = constrain::vocabulary_for(tokenizer_);
  return vocabulary_;
}

json ModelInstance::template_context(const ChatRequest& request, const std::vector<ChatMessage>& messages,
                                     bool add_generation_prompt) const {
  json context = {{"messages", messages_to_template_json(messages)}, {"add_generation_prompt", add_generation_prompt}};
  if (request.tools_enabled) context["tools"] = tools_to_template_json(request.tools);
  if (request.enable_thinking) context["enable_thinking"] = *request.enable_thinking;
  const int32_t bos = tokenizer_.bos_id(), eos = tokenizer_.eos_id();
  context["bos_token"] = bos >= 0 ? std::string(tokenizer_.token_text(bos)) : std::string();
  context["eos_token"] = eos >= 0 ? std::string(tokenizer_.token_text(eos)) : std::string();
  return context;
}

std::vector<int32_t> ModelInstance::message_boundaries(const ChatRequest& request, const std::vector<int32_t>& ids,
                                                       size_t shared) const {
  std::vector<int32_t> out;
  const size_t n = request.messages.size();
  if (!chat_template_ || n < 2) return out;
  std::vector<size_t> counts;
  const std::string& first_role = request.messages[0].role;
  if (first_role == "system" || first_role == "developer") counts.push_back(1);
  if (shared > 1 && shared < n - 1) counts.push_back(shared);
  if (n - 1 > 1 && n - 1 != shared) counts.push_back(n - 1);
  for (size_t k : counts) {
    const std::vector<ChatMessage> prefix(request.messages.begin(),
                                          request.messages.begin() + static_cast<std::ptrdiff_t>(k));
    try {
      const std::vector<int32_t> head =
          tokenizer_.encode(chat_template_->render(template_context(request, prefix, false)), false);
      if (!head.empty() && head.size() < ids.size() && std::equal(head.begin(), head.end(), ids.begin()))
        out.push_back(static_cast<int32_t>(head.size()));
    } catch (const std::exception&) {
      // A template may refuse a partial conversation: no hint there.
    }
  }
  return out;
}

std::string ModelInstance::render_chat(const ChatRequest& request) const {
  if (!chat_template_) {
    throw_api(bad_request(fmt::format("model '{}' has no chat template; use /v1/completions, or start the server with "
                                      "--chat-template FILE",
                                      name()),
                          "messages"));
  }
  try {
    return chat_template_->render(template_context(request, request.messages, true));
  } catch (const Error& e) {
    // Templates reject conversations they cannot express (raise_exception): the client's fault.
    throw_api(bad_request(fmt::format("the chat template rejected the conversation: {}", e.what()), "messages"));
  }
}

// ---------------------------------------------------------------------------------------
bool port_available(const std::string& host, int port, std::string* why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* result = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &result); rc != 0) {
    if (why) *why = fmt::format("cannot resolve host '{}': {}", host, gai_strerror(rc));
    return false;
  }
  bool ok = false;
  std::string reason = "no usable address";
  for (addrinfo* a = result; a; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));  // as the server binds
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0) {
      ok = true;
    } else {
      reason = std::strerror(errno);
    }
    ::close(fd);
    if (ok) break;
  }
  freeaddrinfo(result);
  if (!ok && why) *why = reason;
  return ok;
}

namespace {

// An Ollama system prompt and preset messages meet the GGUF's Jinja template, not the Go
// template Ollama renders them with: a template that takes no system role, or wants roles to
// alternate (raise_exception), would refuse every chat, for messages its client never sent,
// and turns that fill max_input_len would leave no room for any. Each is rendered once here,
// in front of a user's "Hi" (the presets also after a chat's own system message); refused, or
// max_input_len tokens or more, it is left out with a warning (`d.ignored`).
void check_chat_defaults(const ModelInstance& model, GenerationDefaults& d, const std::string& system_file,
                         const std::string& messages_file, int32_t max_input_len) {
  const auto refusal = [&](const GenerationDefaults& with, bool own_system) {
    ChatRequest probe;
    if (own_system) {
      probe.messages.emplace_back();
      probe.messages.back().role = "system";
      probe.messages.back().content = "You are a helpful assistant.";
    }
    probe.messages.emplace_back();
    probe.messages.back().role = "user";
    probe.messages.back().content = "Hi";
    with.apply_chat(probe.messages);
    try {
      const size_t tokens = model.tokenizer().encode(model.render_chat(probe), false).size();
      if (tokens >= static_cast<size_t>(max_input_len))
        return fmt::format("with a user's \"Hi\" they take {} tokens, max_input_len is {}", tokens, max_input_len);
    } catch (const ApiException& e) {  // (render_chat's: no template, or the template refused)
      return e.error.message;
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  // d.source without `file` (a list of the files that gave something)
  const auto forget = [&d](const std::string& file) {
    std::string kept;
    for (size_t at = 0; at <= d.source.size();) {
      const size_t end = std::min(d.source.find(", ", at), d.source.size());
      if (const std::string item = d.source.substr(at, end - at); item != file)
        kept += (kept.empty() ? "" : ", ") + item;
      at = end + 2;
    }
    d.source = kept;
  };
  if (d.system) {
    GenerationDefaults alone;
    alone.system = d.system;
    if (const std::string refused = refusal(alone, false); !refused.empty()) {
      d.ignored.push_back(fmt::format("{}: the system prompt is left out: {}", system_file, refused));
      d.system.reset();
      forget(system_file);
    }
  }
  if (!d.messages.empty()) {
    std::string refused = refusal(d, false);
    if (refused.empty()) refused = refusal(d, true);
    if (!refused.empty()) {
      d.ignored.push_back(fmt::format("{}: the preset messages are left out: {}", messages_file, refused));
      d.messages.clear();
      forget(messages_file);
    }
  }
}

bool has_weights(const fs::path& dir) {
  std::error_code ec;
  if (fs::exists(dir / "model.safetensors.index.json", ec)) return true;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().extension() == ".safetensors") return true;
  }
  return false;
}

// Bytes of KV cache one token takes in the deployment's kv_dtype: K and V of the layers
// that keep a KV cache, as the loaded model's kv_shape() will say (the full-attention
// layers, not a hybrid's linear-attention ones, plus the MTP layer when the checkpoint has
// one: the model loads its head whenever the weights are there).
int64_t kv_bytes_per_token(const ModelConfig& c, DType kv_dtype, const fs::path& weights_dir) {
  int kv_mtp = 0;
  if (c.num_mtp_layers() > 0 || arch_info(c.arch).traits.mtp_from_tensors) {
    try {
      const WeightStore store = WeightStore::open(weights_dir.string());
      kv_mtp = mtp_layers(c, [&store](const std::string& name) { return store.find(name) != nullptr; }) > 0 &&
                       stored_mtp_layers(store) > 0
                   ? 1
                   : 0;
    } catch (const Error&) {
      kv_mtp = 1;  // unreadable weights are reported when the model loads; count the head
    }
  }
  return sequence_geometry(c, kv_mtp, kv_dtype).kv.bytes_per_token();
}

}  // namespace

std::vector<std::shared_ptr<ModelInstance>> prepare_models(const DeployConfig& config) {
  std::vector<std::string> problems;
  auto problem = [&](std::string p) { problems.push_back(std::move(p)); };
  const ServerConfig& s = config.server;

  // Server-wide settings.
  if (s.host.empty()) problem("server.host: must not be empty (use 127.0.0.1 for local use)");
  if (s.port < 1 || s.port > 65535) problem(fmt::format("server.port: {} is not a port number (1-65535)", s.port));
  if (s.body_limit_bytes < 1024)
    problem(fmt::format("server.body_limit: {} bytes is too small; give at least 1KiB", s.body_limit_bytes));
  if (!(s.request_timeout_s > 0)) problem("server.request_timeout_s: must be positive");
  if (!(s.head_timeout_s > 0)) problem("server.head_timeout_s: must be positive");
  if (s.drain_grace_s < 0) problem("server.drain_grace_s: must be zero or positive");
  if (s.http_threads < 2 || s.http_threads > 4096)
    problem(fmt::format("server.http_threads: {} must be in [2, 4096]", s.http_threads));
  if (!s.audit_log_path.empty()) {
    std::ofstream probe(s.audit_log_path, std::ios::app);
    if (!probe)
      problem(fmt::format("server.audit_log: cannot append to '{}'; check that its folder exists and is writable",
                          s.audit_log_path));
  }
  {
    std::set<std::string> ids, keys;
    for (size_t i = 0; i < s.api_keys.size(); ++i) {
      const auto& k = s.api_keys[i];
      if (!ids.insert(k.id).second)
        problem(fmt::format("server.api_keys[{}].id: '{}' is used twice; give each key its own id", i, k.id));
      if (!k.key.empty() && !keys.insert(k.key).second)
        problem(fmt::format("server.api_keys[{}]: the same key is given twice", i));
      if (!k.key.empty() && k.key.size() < 8)
        problem(fmt::format("server.api_keys[{}] ('{}'): keys must be at least 8 characters", i, k.id));
      if (k.requests_per_minute < 0 || k.tokens_per_minute < 0)
        problem(fmt::format("server.api_keys[{}] ('{}'): limits must be zero (unlimited) or positive", i, k.id));
    }
  }

  std::vector<std::shared_ptr<ModelInstance>> instances;
  std::set<std::string> names;
  std::map<int, std::string> ports;  // port -> who uses it
  ports[s.port] = "server.port";
  for (size_t i = 0; i < config.models.size(); ++i) {
    ModelDeployConfig m = config.models[i];
    const std::string w = fmt::format("models[{}]", i);
    if (m.path.empty()) {
      problem(w + ".path: required; give the model directory (config.json, *.safetensors, tokenizer.json)");
      continue;
    }
    const fs::path dir(m.path);
    if (m.name.empty()) {
      m.name = dir.filename().empty() ? dir.parent_path().filename().string() : dir.filename().string();
      // model.gguf / model-00001-of-00003.gguf: "model".
      if (m.name.ends_with(".gguf")) {
        m.name.resize(m.name.size() - 5);
        static const std::regex split("-[0-9]{5}-of-[0-9]{5}$");
        m.name = std::regex_replace(m.name, split, "");
      }
    }
    const std::string who = fmt::format("{} ('{}')", w, m.name);
    if (!names.insert(m.name).second)
      problem(fmt::format("{}.name: '{}' is used by two models; names must be unique", w, m.name));
    if (m.profile != "chat" && m.profile != "long-context")
      problem(fmt::format("{}.profile: '{}' is not a profile; use chat or long-context", who, m.profile));
    if (m.threads < 0) problem(fmt::format("{}.threads: must be 0 (all cores) or positive", who));
    if (m.speculative.method != "none" && m.speculative.method != "ngram" && m.speculative.method != "mtp") {
      problem(fmt::format("{}.speculative.method: '{}' is not a method; use none, ngram or mtp", who,
                          m.speculative.method));
    }
    if (m.speculative.num_draft_tokens < 0 ||
        m.speculative.num_draft_tokens > infera::SpeculativeConfig::kMaxDraftTokens) {
      problem(fmt::format("{}.speculative.num_draft_tokens: {} must be in [0, {}] (0: the method's default)", who,
                          m.speculative.num_draft_tokens, infera::SpeculativeConfig::kMaxDraftTokens));
    }
    if (m.port != 0) {
      if (m.port < 1 || m.port > 65535) {
        problem(fmt::format("{}.port: {} is not a port number (1-65535)", who, m.port));
      } else if (auto [it, fresh] = ports.emplace(m.port, w + ".port"); !fresh) {
        problem(fmt::format("{}.port: {} is also used by {}; give every model its own port", who, m.port, it->second));
      }
    }

    std::error_code ec;
    // A GGUF file (llama.cpp's format) holds the config, tokenizer, template and weights.
    const bool gguf = is_gguf_path(m.path);
    if (!gguf && !fs::is_directory(dir, ec)) {
      problem(fmt::format("{}.path: '{}' is not a readable directory or .gguf file; fix the path", who, m.path));
      continue;
    }
    bool files_ok = true;
    for (const char* file : {"config.json", "tokenizer.json"}) {
      if (!gguf && !fs::exists(dir / file, ec)) {
        problem(fmt::format("{}.path: '{}' has no {}; point it at a Hugging Face model directory", who, m.path, file));
        files_ok = false;
      }
    }
    const fs::path weights_dir = m.quantized_path.empty() ? dir : fs::path(m.quantized_path);
    if (!m.quantized_path.empty() && !fs::is_directory(weights_dir, ec)) {
      problem(fmt::format("{}.quantized: '{}' is not a readable directory; fix the path or remove it", who,
                          m.quantized_path));
    } else if (!(gguf && m.quantized_path.empty()) && !has_weights(weights_dir)) {
      problem(fmt::format("{}: '{}' holds no *.safetensors weights", who, weights_dir.string()));
    }
    if (!files_ok) continue;

    ModelConfig model_config;
    try {
      model_config = load_model_config(m.path);
    } catch (const Error& e) {
      problem(fmt::format("{}: {}", who, e.what()));
      continue;
    }
    std::optional<Tokenizer> tokenizer;
    try {
      tokenizer = Tokenizer::load(m.path);
    } catch (const Error& e) {
      problem(fmt::format("{}: {}", who, e.what()));
    }
    std::unique_ptr<ChatTemplate> chat_template;
    std::string template_source;
    std::string template_origin;
    if (!m.chat_template_file.empty()) {
      try {
        template_source = read_text_file(m.chat_template_file, "the chat template");
        template_origin = m.chat_template_file;
      } catch (const Error& e) {
        problem(fmt::format("{}.chat_template: {}; fix the path", who, e.what()));
      }
    } else {
      try {
        template_source = load_chat_template_config(m.path).chat_template;  // also chat_template.jinja
        template_origin =
            gguf ? m.path + " tokenizer.chat_template" : (dir / "tokenizer_config.json").string() + " chat_template";
      } catch (const Error& e) {
        problem(fmt::format("{}: {}", who, e.what()));
      }
    }
    if (!template_source.empty()) {
      try {
        chat_template = std::make_unique<ChatTemplate>(template_source);
      } catch (const Error& e) {
        problem(fmt::format("{}: the chat template ({}) does not parse: {}", who, template_origin, e.what()));
      }
    }

    if (m.speculative.method == "mtp" && arch_info(model_config.arch).traits.mtp_from_tensors &&
        model_config.num_mtp_layers() == 0) {
      // Qwen3-Next's config.json does not declare its MTP head; its tensors do (headers only).
      try {
        const WeightStore store = WeightStore::open(weights_dir.string());
        model_config.mtp_num_hidden_layers =
            mtp_layers(model_config, [&store](const std::string& name) { return store.find(name) != nullptr; });
      } catch (const Error& e) {
        problem(fmt::format("{}: {}", who, e.what()));
      }
    }
    if (m.speculative.method == "mtp" && model_config.num_mtp_layers() == 0) {
      problem(
          fmt::format("{}.speculative.method: mtp needs a model with a multi-token-prediction head, and {} declares "
                      "none (mtp_num_hidden_layers); use ngram or none",
                      who, (dir / "config.json").string()));
    }
    GenerationDefaults sampling;
    try {
      sampling = load_generation_defaults(m);
    } catch (const Error& e) {
      problem(fmt::format("{}.generation_config: {}", who, e.what()));
    }
    const ResolvedLimits limits = resolve_limits(m, model_config.max_position_embeddings);
    if (limits.max_input_len < 1 || limits.max_input_len > limits.max_context)
      problem(fmt::format("{}.max_input_len: {} must be in [1, {}] (the model's context length)", who,
                          limits.max_input_len, limits.max_context));
    if (limits.max_output_len < 1 || limits.max_output_len > limits.max_context)
      problem(fmt::format("{}.max_output_len: {} must be in [1, {}] (the model's context length)", who,
                          limits.max_output_len, limits.max_context));
    if (limits.max_queue < 0) problem(fmt::format("{}.max_queue: must be zero or positive", who));
    try {
      validate_engine_config(engine_config(m, limits));
    } catch (const Error& e) {
      problem(fmt::format("{}: {}", who, e.what()));
    }
    const int64_t per_token = kv_bytes_per_token(model_config, m.kv_dtype, weights_dir);
    const int64_t longest =
        std::min<int64_t>(int64_t{limits.max_input_len} + limits.max_output_len, limits.max_context);
    if (per_token > 0 && limits.kv_cache_bytes / per_token < longest) {
      problem(
          fmt::format("{}.kv_cache_memory: {} bytes hold {} tokens of KV cache, but max_input_len + max_output_len "
                      "needs {}; raise kv_cache_memory to at least {} bytes or lower the limits",
                      who, limits.kv_cache_bytes, limits.kv_cache_bytes / per_token, longest, longest * per_token));
    }
    if (tokenizer) {
      const std::string system_file = m.ollama_system, messages_file = m.ollama_messages;
      instances.push_back(std::make_shared<ModelInstance>(std::move(m), std::move(model_config), std::move(*tokenizer),
                                                          std::move(chat_template), limits));
      check_chat_defaults(*instances.back(), sampling, system_file, messages_file, limits.max_input_len);
      for (const std::string& why : sampling.ignored) LOG_WARN("{}: ignoring a sampling default: {}", who, why);
      if (!sampling.empty()) {
        LOG_INFO("{}: sampling defaults for requests that leave them out, from {}: {}", who, sampling.source,
                 sampling.describe());
      }
      instances.back()->set_generation_defaults(std::move(sampling));
    }
  }
  for (const auto& key : s.api_keys) {
    for (const auto& model : key.models) {
      if (!names.contains(model))
        problem(fmt::format("server.api_keys ('{}').models: no model is named '{}'", key.id, model));
    }
  }
  // Ports last: only worth probing once the numbers themselves are consistent.
  for (const auto& [port, who] : ports) {
    if (port < 1 || port > 65535) continue;
    std::string why;
    if (!port_available(s.host, port, &why)) {
      problem(fmt::format("{}: cannot listen on {}:{} ({}); stop whatever uses it or pick another port", who, s.host,
                          port, why));
    }
  }
  if (!problems.empty()) {
    std::string all;
    for (const auto& p : problems) all += "\n  " + p;
    fail("{} problem{} in the serving configuration:{}", problems.size(), problems.size() == 1 ? "" : "s", all);
  }
  return instances;
}

}  // namespace infera::server
