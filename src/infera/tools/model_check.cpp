#include "infera/tools/model_check.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "infera/base/error.h"
#include "infera/base/json_file.h"
#include "infera/base/text_file.h"
#include "infera/chat/chat_template.h"
#include "infera/io/gguf.h"
#include "infera/io/safetensors.h"
#include "infera/model/arch_registry.h"
#include "infera/model/config.h"
#include "infera/model/gguf_loader.h"
#include "infera/model/prequant.h"
#include "infera/model/tensor_table.h"
#include "infera/model/weights.h"
#include "infera/tokenizer/tokenizer.h"
#include "infera/tools/planner.h"

namespace infera {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// config.json keys Infera reads or knowingly ignores (training-only, vision tower, bookkeeping).
const std::set<std::string>& known_config_keys() {
  static const std::set<std::string> keys = {
      // common
      "architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
      "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
      "attention_bias", "mlp_bias", "hidden_act", "rope_theta", "rope_scaling", "rope_parameters",
      "partial_rotary_factor", "torch_dtype", "dtype", "bos_token_id", "eos_token_id", "pad_token_id",
      "transformers_version", "initializer_range", "use_cache", "attention_dropout", "pretraining_tp",
      "use_sliding_window", "sliding_window", "max_window_layers", "quantization_config", "text_config",
      "vision_config", "image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id",
      "language_model_only", "auto_map", "_name_or_path", "output_router_logits", "router_aux_loss_coef",
      "tie_encoder_decoder", "is_encoder_decoder", "output_attentions", "output_hidden_states", "return_dict",
      // MoE
      "num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob", "decoder_sparse_step",
      "mlp_only_layers", "shared_expert_intermediate_size",
      // hybrid (qwen3_next / qwen3_5)
      "layer_types", "full_attention_interval", "attn_output_gate", "linear_conv_kernel_dim", "linear_key_head_dim",
      "linear_value_head_dim", "linear_num_key_heads", "linear_num_value_heads", "mamba_ssm_dtype",
      "mtp_num_hidden_layers", "mtp_use_dedicated_embeddings", "output_gate_type",
      // deepseek_v3
      "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_routed_experts",
      "n_shared_experts", "first_k_dense_replace", "moe_layer_freq", "n_group", "topk_group", "topk_method",
      "scoring_func", "routed_scaling_factor", "num_nextn_predict_layers", "aux_loss_alpha", "seq_aux", "ep_size",
      "rope_interleave", "index_n_heads", "index_head_dim", "index_topk"};
  return keys;
}

std::optional<std::string> read_text(const fs::path& p) {
  TextFile f = load_text_file(p.string());
  if (!f.ok()) return std::nullopt;
  return std::move(f.text);
}

class Checker {
 public:
  Checker(const std::string& dir, const CheckOptions& o) : dir_(dir), opt_(o) { r_.dir = dir; }

  CheckReport run() {
    std::error_code ec;
    if (is_gguf_path(dir_.string())) {
      check_gguf();
      check_chat_template();
      if (opt_.verify_manifest) verify_gguf_digests();
      return std::move(r_);
    }
    if (!fs::is_directory(dir_, ec)) {
      error("files", fs::exists(dir_, ec) ? fmt::format("{}: not a directory", dir_.string())
                                          : fmt::format("{}: model directory not found", dir_.string()));
      return std::move(r_);
    }
    check_config();
    check_tokenizer();
    check_weights();
    check_tensors();
    check_chat_template();
    check_manifest();
    return std::move(r_);
  }

 private:
  void issue(CheckSeverity s, const char* topic, std::string msg) { r_.issues.push_back({s, topic, std::move(msg)}); }
  void error(const char* topic, std::string msg) { issue(CheckSeverity::kError, topic, std::move(msg)); }
  void warn(const char* topic, std::string msg) { issue(CheckSeverity::kWarning, topic, std::move(msg)); }
  void info(const char* topic, std::string msg) { issue(CheckSeverity::kInfo, topic, std::move(msg)); }

  // Adds the file to the list; returns its size or -1.
  int64_t add_file(const std::string& rel, const std::string& role, bool required, const char* why = nullptr) {
    const fs::path p = dir_ / rel;
    std::error_code ec;
    CheckFile f{rel, role, -1, true};
    if (fs::is_regular_file(p, ec)) {
      f.bytes = static_cast<int64_t>(fs::file_size(p, ec));
      std::ifstream probe(p, std::ios::binary);
      if (!probe) {
        f.ok = false;
        error("files", fmt::format("{}: present but not readable (check permissions)", rel));
      }
    } else {
      f.ok = !required;
      if (required) error("files", fmt::format("{}: missing{}", rel, why ? fmt::format(" ({})", why) : ""));
    }
    r_.files.push_back(f);
    return f.bytes;
  }

  void check_config() {
    if (add_file("config.json", "config", true, "every Hugging Face model directory has one") < 0) return;
    try {
      config_json_ = parse_json_file_text(read_text(dir_ / "config.json").value_or(""), "config.json");
    } catch (const Error& e) {
      error("config", e.what());
      return;
    }
    if (!config_json_.is_object()) {
      error("config", "config.json: expected a JSON object");
      return;
    }
    if (auto it = config_json_.find("model_type"); it != config_json_.end() && it->is_string()) r_.model_type = *it;
    try {
      cfg_ = parse_model_config(config_json_, "config.json");
      r_.arch = arch_name(cfg_->arch);
      r_.arch_recognised = true;
      r_.arch_runnable = runnable(cfg_->arch);
      r_.context_length = cfg_->max_position_embeddings;
      if (!r_.arch_runnable) {
        warn("config", fmt::format("architecture '{}' is recognised (planning, checks) but Infera cannot run it yet "
                                   "(runs: {})",
                                   r_.model_type, runnable_names()));
      }
    } catch (const Error& e) {
      error("config", e.what());
    }
    // Unknown fields: at the top level and inside text_config.
    std::vector<std::string> unknown;
    auto scan = [&](const json& obj, const std::string& prefix) {
      for (auto it = obj.begin(); it != obj.end(); ++it) {
        if (!known_config_keys().count(it.key())) unknown.push_back(prefix + it.key());
      }
    };
    scan(config_json_, "");
    if (auto it = config_json_.find("text_config"); it != config_json_.end() && it->is_object())
      scan(*it, "text_config.");
    if (!unknown.empty()) {
      std::string list;
      for (const auto& u : unknown) list += (list.empty() ? "" : ", ") + u;
      warn("config", fmt::format("config.json: {} field{} Infera does not know (ignored): {}", unknown.size(),
                                 unknown.size() > 1 ? "s" : "", list));
    }
    if (auto it = config_json_.find("quantization_config"); it != config_json_.end() && it->is_object()) {
      const std::string method = it->value("quant_method", std::string("?"));
      r_.quantization = method;
      if (method == "infera") r_.quantization += " " + it->value("scheme", std::string("?"));
      if (method != "infera") {
        // A published pre-quantized format (model/prequant.h): its tensors are checked below.
        try {
          prequant_ = detect_prequant(dir_.string());
          if (prequant_) r_.quantization = prequant_->summary();
        } catch (const Error& e) {
          error("config", e.what());
        }
      }
    }
    if (!config_json_.contains("quantization_config") && fs::exists(dir_ / "quant_model_description.json")) {
      // Ascend msModelSlim: no quantization_config, every tensor's type in its description file.
      add_file("quant_model_description.json", "quantization", false);
      try {
        prequant_ = detect_prequant(dir_.string());
        if (prequant_) r_.quantization = prequant_->summary();
      } catch (const Error& e) {
        error("config", e.what());
      }
    }
    for (const char* q : {"quantize_config.json", "quantization_config.json"}) {
      if (fs::exists(dir_ / q)) add_file(q, "quantization", false);
    }
  }

  // A GGUF file (llama.cpp's format): config, tokenizer and weights from its metadata and
  // tensor headers, as `infera run -m FILE.gguf` would bind them.
  void check_gguf() {
    std::error_code ec;
    for (const std::string& part : gguf::split_paths(dir_.string())) {
      r_.files.push_back(
          {fs::path(part).filename().string(), "gguf", static_cast<int64_t>(fs::file_size(part, ec)), true});
    }
    try {
      cfg_ = gguf_model_config(dir_.string());
      r_.model_type = cfg_->model_type;
      r_.arch = arch_name(cfg_->arch);
      r_.arch_recognised = true;
      r_.arch_runnable = runnable(cfg_->arch);
      r_.context_length = cfg_->max_position_embeddings;
    } catch (const Error& e) {
      error("config", e.what());
      return;
    }
    try {
      const Tokenizer tok = Tokenizer::load(dir_.string());
      if (static_cast<int64_t>(tok.vocab_size()) > cfg_->vocab_size) {
        error("tokenizer", fmt::format("the GGUF vocabulary has {} tokens but the model only {} embeddings",
                                       tok.vocab_size(), cfg_->vocab_size));
      }
    } catch (const Error& e) {
      error("tokenizer", e.what());
    }
    try {
      const GgufWeightsSummary w = inspect_gguf_weights(dir_.string(), *cfg_);
      r_.tensors = w.tensors;
      r_.params_total = w.parameters;
      r_.weight_bytes = w.file_bytes;
      std::string dtypes;
      for (const auto& [type, n] : w.types) dtypes += fmt::format("{}{} x {}", dtypes.empty() ? "" : ", ", type, n);
      r_.dtypes = dtypes;
    } catch (const Error& e) {
      error("weights", e.what());
    }
  }

  // --verify on a GGUF file: a file carries no checksum of itself, but one from Ollama's
  // store or the Hugging Face cache is named by its SHA-256 (io/manifest.h store_digest).
  void verify_gguf_digests() {
    std::vector<std::string> parts;
    try {
      parts = gguf::split_paths(dir_.string());
    } catch (const Error& e) {
      error("manifest", e.what());
      return;
    }
    ManifestVerification v = verify_store_digests(parts, dir_.parent_path().string());
    if (v.files_checked == 0) {
      error("manifest", fmt::format("{}: nothing to verify it against: a GGUF file holds no checksum of itself, and "
                                    "only a file of Ollama's store or the Hugging Face cache is named by one",
                                    dir_.filename().string()));
      return;
    }
    report_mismatches(v, "its store's name for it", true);
    r_.manifest = std::move(v);
  }

  // store: the sums are the names a store gave the files (not a manifest's lines).
  void report_mismatches(const ManifestVerification& v, const std::string& source, bool store) {
    for (const ManifestMismatch& m : v.problems) {
      switch (m.kind) {
        case ManifestMismatch::Kind::kChanged:
          error("manifest",
                fmt::format("{}: {} differs from {} (expected {}, got {})", m.path,
                            m.expected.size() == 40 ? "git SHA-1" : "SHA-256", source, m.expected, m.actual));
          break;
        case ManifestMismatch::Kind::kMissing:
          error("manifest", store ? fmt::format("{}: links to a blob that is missing (an interrupted download or a "
                                                "pruned cache: download the model again)",
                                                m.path)
                                  : fmt::format("{}: listed in {} but missing", m.path, source));
          break;
        case ManifestMismatch::Kind::kUnreadable: error("manifest", m.actual); break;
        case ManifestMismatch::Kind::kUnlisted:
          // An unlisted index.json or chat_template.jinja changes what loads: an error.
          if (manifest_file_affects_loading(m.path)) {
            error("manifest",
                  fmt::format("{}: present but not listed in {}, and it changes what loads", m.path, source));
          } else {
            warn("manifest", fmt::format("{}: present but not listed in {}", m.path, source));
          }
          break;
      }
    }
  }

  // Whether the directory's config.json is a link into a store's blobs (a Hugging Face cache
  // snapshot).
  bool has_store_digests() const {
    return store_digest((dir_ / "config.json").string()).kind != StoreDigest::Kind::kNone;
  }

  void check_tokenizer() {
    const bool have_json = add_file("tokenizer.json", "tokenizer", true, "Infera reads the fast-tokenizer file") >= 0;
    if (add_file("tokenizer_config.json", "tokenizer", false) < 0) {
      warn("files", "tokenizer_config.json: missing (no chat template or special-token settings)");
    }
    if (fs::exists(dir_ / "generation_config.json")) add_file("generation_config.json", "generation", false);
    if (!have_json) return;
    try {
      Tokenizer tok = Tokenizer::load(dir_.string());
      if (cfg_ && static_cast<int64_t>(tok.vocab_size()) > cfg_->vocab_size) {
        error("tokenizer", fmt::format("tokenizer.json has {} tokens but config.json vocab_size is {}",
                                       tok.vocab_size(), cfg_->vocab_size));
      }
    } catch (const Error& e) {
      error("tokenizer", e.what());
    }
  }

  void check_weights() {
    const fs::path index = dir_ / "model.safetensors.index.json";
    std::vector<std::string> shards;
    std::error_code ec;
    if (fs::exists(index, ec)) {
      add_file("model.safetensors.index.json", "index", true);
      json j;
      try {
        j = parse_json_file_text(read_text(index).value_or(""), "model.safetensors.index.json");
      } catch (const Error& e) {
        error("weights", e.what());
        return;
      }
      auto wm = j.find("weight_map");
      if (wm == j.end() || !wm->is_object()) {
        error("weights", "model.safetensors.index.json: no 'weight_map' object");
        return;
      }
      std::set<std::string> seen;
      for (auto it = wm->begin(); it != wm->end(); ++it) {
        if (!it->is_string()) {
          error("weights", fmt::format("model.safetensors.index.json: weight_map['{}'] is not a file name", it.key()));
          continue;
        }
        index_map_[it.key()] = it->get<std::string>();
        if (seen.insert(it->get<std::string>()).second) shards.push_back(it->get<std::string>());
      }
    } else if (fs::exists(dir_ / "model.safetensors", ec)) {
      shards.push_back("model.safetensors");
    } else if (fs::exists(dir_ / "quant_model_weights.safetensors", ec)) {  // msModelSlim
      shards.push_back("quant_model_weights.safetensors");
    } else {
      error("weights", "no weights: neither model.safetensors nor model.safetensors.index.json is present");
      return;
    }
    std::map<std::string, int64_t> dtype_counts;
    for (const std::string& shard : shards) {
      const int64_t size = add_file(shard, "weights", false);
      if (size < 0) {
        int64_t named = 0;
        for (const auto& [name, file] : index_map_) named += file == shard ? 1 : 0;
        error("weights", fmt::format("{}: missing shard (the index names it for {} tensors)", shard, named));
        r_.files.back().ok = false;
        continue;
      }
      r_.weight_bytes += size;
      std::vector<TensorInfo> tensors;
      try {
        tensors = read_safetensors_header((dir_ / shard).string());
      } catch (const Error& e) {
        error("weights", e.what());
        r_.files.back().ok = false;
        continue;
      }
      // The data section should end where the file ends: extra bytes mean a bad copy.
      uint64_t header_len = 0;
      if (FILE* f = std::fopen((dir_ / shard).string().c_str(), "rb")) {
        if (std::fread(&header_len, 1, 8, f) != 8) header_len = 0;
        std::fclose(f);
      }
      size_t data_end = 0;
      for (const TensorInfo& t : tensors) {
        data_end += t.nbytes;
        ++dtype_counts[std::string(safetensors_dtype_name(t.dtype))];
        found_[t.name] = {t.shape, shard, t.dtype};
        auto it = index_map_.find(t.name);
        if (!index_map_.empty() && (it == index_map_.end() || it->second != shard)) {
          warn("weights", fmt::format("{}: holds tensor '{}' that the index {}", shard, t.name,
                                      it == index_map_.end() ? "does not list" : "places in " + it->second));
        }
      }
      const uint64_t expected = 8 + header_len + data_end;
      if (header_len > 0 && static_cast<uint64_t>(size) > expected) {
        warn("weights", fmt::format("{}: {} bytes after the last tensor (expected {} bytes, file has {})", shard,
                                    static_cast<uint64_t>(size) - expected, expected, size));
      }
    }
    for (const auto& [name, file] : index_map_) {
      if (found_.count(name)) continue;
      bool shard_ok = std::any_of(r_.files.begin(), r_.files.end(),
                                  [&](const CheckFile& f) { return f.path == file && f.ok && f.bytes >= 0; });
      if (shard_ok) error("weights", fmt::format("{}: tensor '{}' listed in the index is not in the file", file, name));
    }
    r_.tensors = static_cast<int64_t>(found_.size());
    for (const auto& [dt, n] : dtype_counts)
      r_.dtypes += fmt::format("{}{} x {}", r_.dtypes.empty() ? "" : ", ", dt, n);
    for (const auto& [name, t] : found_) {
      if (name.size() > 7 && name.compare(name.size() - 7, 7, ".scales") == 0) continue;
      int64_t n = 1;
      for (int64_t d : t.shape) n *= d;
      // int4 packs two weights per byte.
      const bool int4 = t.dtype == DType::kU8 && name.size() > 8 && name.compare(name.size() - 8, 8, ".qweight") == 0;
      r_.params_total += int4 ? 2 * n : n;
    }
  }

  void check_tensors() {
    if (!cfg_ || found_.empty()) return;
    std::vector<TensorSpec> expected;
    std::string layers_prefix;  // "model.layers." (or the nested text model's)
    try {
      ModelConfig cfg = *cfg_;
      // The table as this checkpoint lays it out (text prefix, expert layout, MTP layers).
      const HasTensor has = [this](const std::string& name) { return found_.count(name) > 0; };
      // Qwen3-Next's config.json does not declare its MTP head; its tensors do.
      if (arch_info(cfg.arch).traits.mtp_from_tensors) cfg.mtp_num_hidden_layers = mtp_layers(cfg, has);
      expected = tensor_table(cfg, has);
      layers_prefix = text_prefix(cfg, has) + "layers.";
      const ParamCounts pc = count_parameters(cfg);
      r_.params_active = r_.params_total - (pc.total + pc.mtp - pc.active);
    } catch (const Error& e) {
      warn("tensors", e.what());
      return;
    }
    // Not runnable archs: shape problems are warnings (the layout may vary between releases).
    const CheckSeverity bad = r_.arch_runnable ? CheckSeverity::kError : CheckSeverity::kWarning;
    std::set<std::string> used;
    int missing = 0, wrong = 0;
    std::vector<std::string> examples;
    // Pre-quantized: every quantized matrix located and validated as the loader will.
    std::optional<WeightStore> headers;
    if (prequant_) {
      std::vector<TensorInfo> infos;
      for (const auto& [name, f] : found_) {
        TensorInfo t;
        t.name = name;
        t.dtype = f.dtype;
        t.shape = f.shape;
        t.file = f.file;
        int64_t n = 1;
        for (int64_t d : f.shape) n *= d;
        t.nbytes = static_cast<size_t>(n) * dtype_size(f.dtype);
        infos.push_back(std::move(t));
      }
      headers = WeightStore::from_tensors(dir_.string(), std::move(infos), nullptr, 0);
      const PrequantReport pr =
          check_prequant(*prequant_, *headers, expected, prequant_target_from_options(), prequant_fp8_from_options());
      used.insert(pr.used.begin(), pr.used.end());
      info("tensors", fmt::format("{}: {} quantized weights ({} map exactly onto Infera's schemes, {} are "
                                  "requantized at load{}), {} float matrices; {} stored -> {} in memory",
                                  pr.summary, pr.quantized, pr.exact, pr.quantized - pr.exact,
                                  pr.dequantized > 0 ? fmt::format("; {} kept as f32", pr.dequantized) : std::string(),
                                  pr.plain, format_bytes(pr.stored_bytes), format_bytes(pr.native_bytes)));
      for (size_t i = 0; i < pr.errors.size() && i < 5; ++i) issue(bad, "tensors", pr.errors[i]);
      if (pr.errors.size() > 5)
        issue(bad, "tensors", fmt::format("{} more quantized weights with problems", pr.errors.size() - 5));
    }
    for (const TensorSpec& e : expected) {
      if (headers && e.role != WeightRole::kVector && prequant_->quantizes(*headers, e.name)) continue;  // above
      auto it = found_.find(e.name);
      std::vector<int64_t> want = e.shape;
      if (it == found_.end()) {
        // Quantized by `infera quantize`: <name>.qweight [n, k] (int8) or [n, k/2] (int4).
        auto q = found_.find(e.name + ".qweight");
        if (q != found_.end()) {
          used.insert(q->first);
          used.insert(e.name + ".scales");
          if (q->second.shape.empty() || q->second.shape[0] != e.shape[0]) {
            ++wrong;
            if (examples.size() < 5)
              examples.push_back(fmt::format("'{}' has shape {}, config.json implies [{}, ...]", q->first,
                                             shape_string(q->second.shape), e.shape[0]));
          }
          continue;
        }
        // MTP weights are optional (a checkpoint may ship without them).
        if (e.mtp) continue;
        ++missing;
        if (examples.size() < 5) examples.push_back(fmt::format("'{}' {} is missing", e.name, shape_string(want)));
        continue;
      }
      used.insert(e.name);
      if (it->second.shape != want) {
        ++wrong;
        if (examples.size() < 5) {
          examples.push_back(fmt::format("{}: '{}' has shape {}, config.json implies {}", it->second.file, e.name,
                                         shape_string(it->second.shape), shape_string(want)));
        }
      }
    }
    if (missing || wrong) {
      std::string msg =
          fmt::format("{} tensor{} missing, {} with the wrong shape", missing, missing == 1 ? "" : "s", wrong);
      for (const auto& ex : examples) msg += "; " + ex;
      issue(bad, "tensors", msg);
    }
    std::vector<std::string> extra;
    for (const auto& [name, t] : found_) {
      if (!used.count(name) && !(prequant_ && prequant_->is_auxiliary(name))) extra.push_back(name);
    }
    if (!extra.empty()) {
      info("tensors", fmt::format("{} tensor{} not used by the text model (e.g. '{}')", extra.size(),
                                  extra.size() > 1 ? "s" : "", extra.front()));
    }
    // Unused tensors of decoder layers past num_hidden_layers: config.json describes fewer
    // layers than the checkpoint holds (a model that would run truncated, or with an MTP
    // block as a trunk layer), not a vision tower or an extra head left aside.
    int past = 0;
    std::string first_past;
    for (const std::string& name : extra) {
      if (!name.starts_with(layers_prefix)) continue;
      int layer = 0;
      const char* at = name.data() + layers_prefix.size();
      const auto [end, ec] = std::from_chars(at, name.data() + name.size(), layer);
      if (ec == std::errc() && end != at && *end == '.' && layer >= cfg_->num_layers && past++ == 0) first_past = name;
    }
    if (past > 0) {
      warn("tensors", fmt::format("{} unused tensor{} of decoder layers past num_hidden_layers {} (e.g. '{}'): "
                                  "config.json describes fewer layers than the checkpoint holds",
                                  past, past > 1 ? "s" : "", cfg_->num_layers, first_past));
    }
  }

  void check_chat_template() {
    ChatTemplateConfig tc;
    try {
      tc = load_chat_template_config(dir_.string());
    } catch (const Error& e) {
      if (fs::exists(dir_ / "tokenizer_config.json")) error("chat_template", e.what());
      return;
    }
    if (tc.chat_template.empty()) {
      info("chat_template", "no chat template (chat requests will need --chat-template)");
      return;
    }
    try {
      ChatTemplate t(tc.chat_template);
      json ctx = {{"messages", json::array({{{"role", "user"}, {"content", "Hello"}}})},
                  {"add_generation_prompt", true},
                  {"bos_token", tc.bos_token.value_or("")},
                  {"eos_token", tc.eos_token.value_or("")}};
      const std::string out = t.render(ctx);
      if (out.find("Hello") == std::string::npos) {
        warn("chat_template", "the chat template renders a one-message conversation without its text");
      }
      chat_template_chars_ = tc.chat_template.size();
    } catch (const Error& e) {
      error("chat_template", e.what());
    }
  }

  void check_manifest() {
    if (opt_.verify_manifest) {
      try {
        std::error_code ec;
        ManifestVerification v;
        std::string source = kManifestName;
        const bool store = !fs::exists(dir_ / kManifestName, ec) && has_store_digests();
        if (store) {
          // A Hugging Face cache snapshot: its files' links name their checksums.
          std::vector<std::string> files;
          for (const std::string& rel : manifest_files(dir_.string())) files.push_back((dir_ / rel).string());
          v = verify_store_digests(files, dir_.string());
          source = "the Hugging Face cache's names for them";
        } else {
          v = verify_manifest(dir_.string());
        }
        report_mismatches(v, source, store);
        r_.manifest = std::move(v);
      } catch (const Error& e) {
        error("manifest", e.what());
      }
    }
    if (opt_.write_manifest) {
      try {
        r_.manifest_written = write_manifest(dir_.string()).size();
      } catch (const Error& e) {
        error("manifest", e.what());
      }
    }
    if (chat_template_chars_)
      info("chat_template", fmt::format("chat template parses and renders ({} chars)", chat_template_chars_));
  }

  struct Found {
    std::vector<int64_t> shape;
    std::string file;
    DType dtype;
  };
  // Whether Infera runs `arch`, and the names of those it runs, by the rows the options give.
  bool runnable(Arch arch) const {
    if (!opt_.arch_rows) return arch_info(arch).runnable();
    for (const ArchInfo& a : *opt_.arch_rows) {
      if (a.arch == arch) return a.runnable();
    }
    return false;
  }
  std::string runnable_names() const {
    if (!opt_.arch_rows) return runnable_arch_names();
    std::string s;
    for (const ArchInfo& a : *opt_.arch_rows) {
      if (a.runnable()) s += (s.empty() ? "" : ", ") + std::string(a.name);
    }
    return s;
  }
  fs::path dir_;
  CheckOptions opt_;
  CheckReport r_;
  json config_json_;
  std::optional<ModelConfig> cfg_;
  std::map<std::string, std::string> index_map_;
  std::map<std::string, Found> found_;
  std::unique_ptr<PrequantFormat> prequant_;  // a published pre-quantized format, when config.json says so
  size_t chat_template_chars_ = 0;
};

}  // namespace

const char* check_severity_name(CheckSeverity s) {
  switch (s) {
    case CheckSeverity::kInfo: return "info";
    case CheckSeverity::kWarning: return "warning";
    case CheckSeverity::kError: return "error";
  }
  return "?";
}

int CheckReport::errors() const {
  return static_cast<int>(std::count_if(issues.begin(), issues.end(),
                                        [](const CheckIssue& i) { return i.severity == CheckSeverity::kError; }));
}
int CheckReport::warnings() const {
  return static_cast<int>(std::count_if(issues.begin(), issues.end(),
                                        [](const CheckIssue& i) { return i.severity == CheckSeverity::kWarning; }));
}
int CheckReport::exit_code() const { return errors() ? 2 : warnings() ? 1 : 0; }

json CheckReport::to_json() const {
  json files_j = json::array();
  for (const CheckFile& f : files) {
    files_j.push_back({{"path", f.path}, {"role", f.role}, {"bytes", f.bytes}, {"ok", f.ok}});
  }
  json issues_j = json::array();
  for (const CheckIssue& i : issues) {
    issues_j.push_back({{"severity", check_severity_name(i.severity)}, {"topic", i.topic}, {"message", i.message}});
  }
  json j = {{"dir", dir},
            {"model_type", model_type},
            {"arch", arch},
            {"arch_recognised", arch_recognised},
            {"arch_runnable", arch_runnable},
            {"params_total", params_total},
            {"params_active", params_active},
            {"dtypes", dtypes},
            {"quantization", quantization},
            {"context_length", context_length},
            {"weight_bytes", weight_bytes},
            {"tensors", tensors},
            {"files", files_j},
            {"issues", issues_j},
            {"errors", errors()},
            {"warnings", warnings()},
            {"exit_code", exit_code()}};
  if (manifest) {
    json problems = json::array();
    for (const auto& m : manifest->problems) {
      problems.push_back(
          {{"path", m.path}, {"kind", mismatch_kind_name(m.kind)}, {"expected", m.expected}, {"actual", m.actual}});
    }
    j["manifest"] = {{"verified", manifest->ok()}, {"files_checked", manifest->files_checked}, {"problems", problems}};
  }
  if (manifest_written) j["manifest_written"] = manifest_written;
  return j;
}

std::string CheckReport::to_text() const {
  std::string s = fmt::format("model        {}\n", dir);
  s += fmt::format("architecture {}{}\n", model_type.empty() ? "?" : model_type,
                   !arch_recognised ? " (not recognised)"
                   : arch_runnable  ? " (supported)"
                                    : " (recognised, cannot run yet)");
  if (params_total) {
    s += fmt::format("parameters   {} total", format_count(params_total));
    if (params_active && params_active != params_total)
      s += fmt::format(", {} active per token", format_count(params_active));
    s += "\n";
  }
  s += fmt::format("weights      {} tensors, {}{}\n", tensors, format_bytes(weight_bytes),
                   dtypes.empty() ? "" : " (" + dtypes + ")");
  s += fmt::format("quantization {}\n", quantization.empty() ? "none" : quantization);
  if (context_length) s += fmt::format("context      {} tokens\n", context_length);
  int present = 0;
  for (const CheckFile& f : files) present += f.bytes >= 0 ? 1 : 0;
  s += fmt::format("files        {} present of {} expected\n", present, files.size());
  if (manifest) {
    s += fmt::format("manifest     {} files checked: {}\n", manifest->files_checked,
                     manifest->ok() ? "all match" : "MISMATCH");
  }
  if (manifest_written) s += fmt::format("manifest     wrote {} ({} files)\n", kManifestName, manifest_written);
  for (const CheckIssue& i : issues)
    s += fmt::format("{:<7} [{}] {}\n", check_severity_name(i.severity), i.topic, i.message);
  const int e = errors(), w = warnings();
  s += fmt::format("result       {} error{}, {} warning{} (exit {})\n", e, e == 1 ? "" : "s", w, w == 1 ? "" : "s",
                   exit_code());
  return s;
}

CheckReport check_model_dir(const std::string& dir, const CheckOptions& options) {
  Checker c(dir, options);
  try {
    return c.run();
  } catch (const Error& e) {
    CheckReport r;
    r.dir = dir;
    r.issues.push_back({CheckSeverity::kError, "internal", e.what()});
    return r;
  }
}

}  // namespace infera
