// Models shared by the runtime tests, loaded once per test process: the trained
// stories260K (llama, attention only) and a tiny random qwen3_5_moe hybrid with an MTP
// head written by tools/gen_model.py (Gated DeltaNet + attention + MoE).
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "../test_support.h"
#include "infera/model/model.h"
#include "infera/runtime/engine_config.h"

namespace infera::testing_support {

inline Model& stories_model() {
  static std::unique_ptr<Model> model = [] {
    LoadOptions o;
    o.max_batch_tokens = 512;
    return load_model(test::stories_dir(), o);
  }();
  return *model;
}

inline Model& hybrid_model() {
  namespace fs = std::filesystem;
  static std::unique_ptr<Model> model = [] {
    const fs::path dir = fs::temp_directory_path() / ("infera_test_hybrid_" + std::to_string(::getpid()));
    LoadOptions o;
    o.max_batch_tokens = 512;
    auto m = load_model(test::generate_model(dir, test::kTinyHybridArgs), o);
    std::error_code ec;
    fs::remove_all(dir, ec);  // the mapping stays valid after the files are unlinked
    return m;
  }();
  return *model;
}

// A tiny random deepseek_v3 (MLA, grouped sigmoid MoE after a dense first layer, YaRN,
// and its MTP layer).
inline Model& deepseek_model() {
  namespace fs = std::filesystem;
  static std::unique_ptr<Model> model = [] {
    const fs::path dir = fs::temp_directory_path() / ("infera_test_deepseek_" + std::to_string(::getpid()));
    LoadOptions o;
    o.max_batch_tokens = 512;
    auto m = load_model(test::generate_model(dir,
                                             "--arch deepseek_v3 --layers 2 --experts 8 --n-group 4"
                                             " --topk-group 2 --rope-scaling yarn --rope-factor 4"
                                             " --rope-orig-max-pos 32 --vocab 300 --seed 6"),
                        o);
    std::error_code ec;
    fs::remove_all(dir, ec);  // the mapping stays valid after the files are unlinked
    return m;
  }();
  return *model;
}

// A drafter that knows each prompt's plain greedy continuation and proposes it, except at
// the continuation indices where wrong(index) holds: there it proposes the next token id
// (mod vocab), a planted rejection. prompts and continuations are read when it runs.
inline SpeculativeConfig::Drafter oracle_drafter(const std::vector<std::vector<int32_t>>& prompts,
                                                 const std::vector<std::vector<int32_t>>& continuations,
                                                 std::function<bool(size_t index)> wrong, int32_t vocab = 300) {
  return [&prompts, &continuations, wrong = std::move(wrong), vocab](std::span<const int32_t> history,
                                                                     int32_t max_draft, std::vector<int32_t>& out) {
    for (size_t i = 0; i < prompts.size(); ++i) {
      const auto& p = prompts[i];
      if (history.size() <= p.size() || !std::equal(p.begin(), p.end(), history.begin())) continue;
      const size_t generated = history.size() - p.size();
      for (int32_t j = 0; j < max_draft && generated + j < continuations[i].size(); ++j) {
        const size_t at = generated + j;  // index of the drafted token in the continuation
        out.push_back(wrong(at) ? (continuations[i][at] + 1) % vocab : continuations[i][at]);
      }
      return;
    }
  };
}

}  // namespace infera::testing_support
