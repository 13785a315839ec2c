// `infera check`: everything that can be verified about a model directory before it is
// loaded: architecture, expected files, safetensors headers against file sizes and against
// the shapes config.json implies, unknown config fields, the chat template, and optional
// SHA-256 manifests. Nothing is mapped or read beyond headers (manifests read every byte).
//
// Exit codes (CheckReport::exit_code): 0 = no problem, 1 = warnings only, 2 = errors.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "infera/io/manifest.h"

namespace infera {

struct ArchInfo;

enum class CheckSeverity { kInfo, kWarning, kError };
const char* check_severity_name(CheckSeverity s);

struct CheckIssue {
  CheckSeverity severity = CheckSeverity::kInfo;
  std::string topic;  // "config", "files", "weights", "tensors", "tokenizer", "chat_template", "manifest"
  std::string message;
};

struct CheckFile {
  std::string path;  // relative to the model directory
  std::string role;  // "config", "tokenizer", "weights", "index", ...
  int64_t bytes = -1;  // -1: missing
  bool ok = true;
};

struct CheckOptions {
  bool write_manifest = false;
  bool verify_manifest = false;
  // The architecture rows that say which architectures Infera runs (nullptr: the registry,
  // model/arch_registry.h); tests pass a changed copy.
  const std::vector<ArchInfo>* arch_rows = nullptr;
};

struct CheckReport {
  std::string dir;
  std::string model_type;
  std::string arch;  // normalized name ("qwen3_5_moe"); empty when unknown
  bool arch_recognised = false;
  bool arch_runnable = false;  // Infera has a forward for it today
  int64_t params_total = 0;  // from the tensors found (int4 packed weights counted as 2 per byte)
  int64_t params_active = 0;  // per token (MoE: k of E experts); from config
  std::string dtypes;  // "BF16 x 291, F32 x 3"
  std::string quantization;  // quant_method / scheme, "" when none
  int64_t context_length = 0;  // max_position_embeddings
  int64_t weight_bytes = 0;  // sum of safetensors file sizes
  int64_t tensors = 0;
  std::vector<CheckFile> files;
  std::vector<CheckIssue> issues;
  std::optional<ManifestVerification> manifest;  // with --verify
  size_t manifest_written = 0;  // files listed, with --write-manifest

  int errors() const;
  int warnings() const;
  int exit_code() const;  // 0 ok, 1 warnings, 2 errors
  nlohmann::json to_json() const;
  std::string to_text() const;
};

// Never throws for problems of the directory: they become issues.
CheckReport check_model_dir(const std::string& dir, const CheckOptions& options = {});

}  // namespace infera
