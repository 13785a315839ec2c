// infera plan: memory and capacity plan per device for a model (directory or config.json),
// weight scheme, context, concurrency and tensor parallelism. Nothing is loaded.
#include <cstdio>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "infera/base/error.h"
#include "infera/base/json_file.h"
#include "infera/cli/command.h"
#include "infera/cli/model_paths.h"
#include "infera/io/safetensors.h"
#include "infera/model/config.h"
#include "infera/model/gguf_loader.h"
#include "infera/model/prequant.h"
#include "infera/model/tensor_table.h"
#include "infera/tools/planner.h"

namespace infera::cli {
namespace {

namespace fs = std::filesystem;

struct PlanCmdOptions {
  std::string model_dir;
  std::string arch_config;
  std::string scheme = "auto";
  int64_t group_size = 32;
  int64_t ctx = 4096;
  int64_t concurrency = 1;
  int tp = 1;
  std::string memory;
  std::string kv_dtype = "f32";
  int64_t prefill_chunk = 512;
  int64_t prefix_checkpoints = 0;
  std::string reserve = "16MiB";
  bool no_mtp = false;
  bool json = false;
};

// Sum of tensor bytes in the directory's safetensors (headers only).
int64_t stored_weight_bytes(const std::string& dir) {
  // A GGUF file: the weights as loaded (tensors of llama.cpp's block types dequantized).
  if (is_gguf_path(dir)) return inspect_gguf_weights(dir, load_model_config(dir)).resident_bytes;
  std::vector<std::string> shards;
  // Hugging Face's names, else msModelSlim's (its weights beside quant_model_description.json),
  // as WeightStore::open looks them up.
  const bool slim = !fs::exists(fs::path(dir) / "model.safetensors.index.json") &&
                    !fs::exists(fs::path(dir) / "model.safetensors") &&
                    (fs::exists(fs::path(dir) / "quant_model_weights.safetensors.index.json") ||
                     fs::exists(fs::path(dir) / "quant_model_weights.safetensors"));
  const std::string base = slim ? "quant_model_weights.safetensors" : "model.safetensors";
  const fs::path index = fs::path(dir) / (base + ".index.json");
  if (fs::exists(index)) {
    const nlohmann::json j = read_json_file(index.string(), "cannot read the weights' index");
    std::set<std::string> seen;
    for (auto& [name, file] : j.at("weight_map").items()) {
      if (seen.insert(file.get<std::string>()).second) shards.push_back(file.get<std::string>());
    }
  } else {
    shards.push_back(base);
  }
  int64_t bytes = 0;
  std::vector<TensorInfo> all;
  for (const auto& s : shards) {
    for (TensorInfo& t : read_safetensors_header((fs::path(dir) / s).string())) {
      bytes += static_cast<int64_t>(t.nbytes);
      all.push_back(std::move(t));
    }
  }
  // A published pre-quantized checkpoint: its quantized weights as converted at load
  // (model/prequant.h), the rest as stored.
  if (std::unique_ptr<PrequantFormat> f = detect_prequant(dir)) {
    const WeightStore headers = WeightStore::from_tensors(dir, std::move(all), nullptr, 0);
    const ModelConfig cfg = load_model_config(dir);
    const PrequantReport r =
        check_prequant(*f, headers,
                       tensor_table(cfg, [&headers, &f](const std::string& n) { return f->stores(headers, n); }),
                       prequant_target_from_options(), prequant_fp8_from_options());
    if (!r.errors.empty()) fail("{}", r.errors.front());
    bytes += r.native_bytes - r.stored_bytes;
  }
  return bytes;
}

int run(const PlanCmdOptions& o) {
  if (o.model_dir.empty() == o.arch_config.empty())
    fail("give exactly one of -m MODEL_DIR or --arch-config config.json");
  ModelConfig cfg;
  if (!o.model_dir.empty()) {
    cfg = load_model_config(o.model_dir);
  } else {
    cfg = parse_model_config(read_json_file(o.arch_config, "cannot read the --arch-config"), o.arch_config);
  }
  PlanOptions p;
  if (o.scheme == "auto") {
    // A model directory: weights exactly as stored; a bare config: its dtype (bf16 default).
    if (!o.model_dir.empty()) {
      p.weights_bytes_override = stored_weight_bytes(o.model_dir);
      p.scheme = cfg.torch_dtype == "float32" ? WeightScheme::kF32 : WeightScheme::kBF16;
    } else {
      p.scheme = cfg.torch_dtype == "float32" ? WeightScheme::kF32 : WeightScheme::kBF16;
    }
  } else {
    p.scheme = parse_weight_scheme(o.scheme);
  }
  if (o.group_size != 32 && o.group_size != 64 && o.group_size != 128) fail("--group-size must be 32, 64 or 128");
  p.group_size = o.group_size;
  p.ctx = o.ctx;
  p.concurrency = o.concurrency;
  p.tp = o.tp;
  p.memory_bytes = o.memory.empty() ? 0 : parse_byte_size(o.memory);
  p.kv_dtype = parse_kv_cache_dtype(o.kv_dtype);
  p.prefill_chunk = o.prefill_chunk;
  p.reserve_bytes = parse_byte_size(o.reserve);
  p.include_mtp = !o.no_mtp;
  p.prefix_checkpoints = o.prefix_checkpoints;
  const Plan plan = plan_memory(cfg, p);
  if (o.json)
    std::printf("%s\n", plan.to_json().dump(2).c_str());
  else
    std::fputs(plan.to_text().c_str(), stdout);
  return 0;
}

void setup(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("plan", "Memory and capacity plan per device (weights, KV cache, activations) before loading");
  auto o = std::make_shared<PlanCmdOptions>();
  cmd->add_option("-m,--model", o->model_dir, "Model: a directory, a GGUF file, ollama:NAME or hf:ORG/NAME")
      ->transform(infera::cli::model_ref_transform());
  cmd->add_option("--arch-config", o->arch_config, "A config.json instead of a model directory (see examples/configs)");
  cmd->add_option("--scheme", o->scheme, "Weight scheme: auto (as stored), f32, bf16, f16, w8a8, w4a8, w4a16")
      ->default_val("auto");
  cmd->add_option("--group-size", o->group_size, "int4 group size (32, 64, 128)")->default_val(32);
  cmd->add_option("--ctx", o->ctx, "Tokens per sequence (prompt + output)")
      ->default_val(4096)
      ->check(CLI::PositiveNumber);
  cmd->add_option("--concurrency", o->concurrency, "Sequences resident at once")
      ->default_val(1)
      ->check(CLI::PositiveNumber);
  cmd->add_option("--tp", o->tp, "Tensor-parallel devices")->default_val(1)->check(CLI::PositiveNumber);
  cmd->add_option("--memory", o->memory, "Memory budget per device, e.g. 24GiB, 80GB");
  cmd->add_option("--kv-dtype", o->kv_dtype,
                  "KV cache element type: f32 (default), bf16, int8 (with an f32 scale per token and KV head)")
      ->default_val("f32");
  cmd->add_option("--prefill-chunk", o->prefill_chunk, "Prompt tokens per forward")
      ->default_val(512)
      ->check(CLI::PositiveNumber);
  cmd->add_option("--reserve", o->reserve, "Runtime reserve per device (code, libraries, tokenizer, threads)")
      ->default_val("16MiB");
  cmd->add_option("--prefix-checkpoints", o->prefix_checkpoints,
                  "Hybrids: recurrent-state checkpoints the prefix cache keeps (each one sequence's state)")
      ->default_val(0)
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--no-mtp", o->no_mtp, "Leave out multi-token-prediction weights and their KV layer");
  cmd->add_flag("--json", o->json, "Print the plan as one JSON object");
  cmd->callback([o] { set_exit_code(run(*o)); });
}

}  // namespace

INFERA_REGISTER_COMMAND(plan, setup);

}  // namespace infera::cli
