// The model seam: one forward over a batch that packs chunks of several sequences
// (decode tokens and prefill chunks alike). Architecture files (llama.cpp, ...) implement
// it; the runtime owns which KV blocks each sequence holds.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "infera/model/config.h"
#include "infera/model/kv_pool.h"

namespace infera {

// One sequence's slice of a batch: tokens [token_begin, token_begin + n_tokens) of
// ForwardBatch::tokens sit at positions pos0 .. pos0 + n_tokens - 1 of the sequence.
struct SeqChunk {
  int32_t token_begin = 0;
  int32_t n_tokens = 0;
  int32_t pos0 = 0;
  const int32_t* block_table = nullptr;  // blocks covering positions [0, pos0 + n_tokens)
  int32_t n_blocks = 0;
  bool all_logits = false;  // logits for every token of the chunk (eval, speculative verify)
  bool last_logits = true;  // logits for the chunk's last token
};

struct ForwardBatch {
  std::vector<int32_t> tokens;  // [n_tokens]
  std::vector<SeqChunk> seqs;
  int32_t num_logit_rows() const;
};

struct LoadOptions {
  bool load_into_memory = false;  // read weights into RAM instead of mmap
  int32_t max_batch_tokens = 512; // scratch buffers are sized for this many tokens
};

class Model {
 public:
  virtual ~Model() = default;
  const ModelConfig& config() const { return config_; }

  // Geometry of the KV pool this model needs (num_blocks left for the caller to set).
  virtual KvPoolShape kv_shape(int64_t block_size) const = 0;

  // Runs the batch, writing the new tokens' K/V into `kv` and the requested logits rows
  // (in batch order: per chunk, all rows when all_logits, else the last row when
  // last_logits) into `logits` [num_logit_rows, vocab_size].
  virtual void forward(const ForwardBatch& batch, KvPool& kv, float* logits) = 0;

  // Bytes of weights read for one decode token (bandwidth accounting).
  virtual int64_t weight_bytes_per_token() const = 0;
  virtual int64_t num_parameters() const = 0;

 protected:
  ModelConfig config_;
};

// Loads the model directory (config.json + safetensors). Throws infera::Error.
std::unique_ptr<Model> load_model(const std::string& dir, const LoadOptions& options = {});

}  // namespace infera
