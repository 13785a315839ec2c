// Debug dump of named intermediates (`infera run --dump-tensors NAME,...`): while an
// architecture is brought up, its per-layer activations can be written out and diffed
// layer by layer against a reference implementation (tools/diff_dump.py reads them back).
//
// Names a model writes (each [rows, cols] f32, rows in batch order):
//   embed        [T, H]  token embeddings (the residual stream entering layer 0)
//   attn_norm    [T, H]  per layer: the normed input of the attention / linear-attention mixer
//   attn_out     [T, H]  per layer: the mixer's output, before the residual add
//   ffn_norm     [T, H]  per layer: the normed input of the MLP / MoE
//   ffn_out      [T, H]  per layer: the MLP / MoE output, before the residual add
//   layer_out    [T, H]  per layer: the residual stream after the layer
//   final_norm   [R, H]  the logits rows after the final norm
//   logits       [R, V]  what forward() returns
// (Qwen3.5 / Qwen3-Next write embed, layer_out, final_norm and logits.) "all" selects every
// name. Only rank 0 of a tensor-parallel group writes, and partial sums are not dumped.
//
// Files: DIR/<forward>-<name>[-<layer>].npy (NumPy .npy, float32, C order), forward
// counting from 0 per model, layer zero-padded to three digits; DIR/index.tsv lists one
// line per file: file, name, layer (-1 for none), forward, rows, cols.
//
// Off (the default), a model holds no TensorDump and each dump point is one null-pointer
// test per layer: nothing is copied or computed.
#pragma once

#include <cstdint>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

namespace infera {

class TensorDump {
 public:
  // names: comma-separated ("attn_out,logits" or "all"). Creates `dir`. Throws
  // infera::Error for an unknown name or a directory that cannot be written.
  TensorDump(const std::string& names, const std::string& dir);
  ~TensorDump();
  TensorDump(const TensorDump&) = delete;
  TensorDump& operator=(const TensorDump&) = delete;

  // Every name a model can write, comma-separated (for help texts and errors).
  static const char* known_names();

  bool wants(const char* name) const { return all_ || names_.count(name) > 0; }
  // Called by the model at the start of each forward.
  void begin_forward() { ++forward_; }
  // Writes `data` [rows, cols] when `name` is selected; layer -1 for a global tensor.
  void write(const char* name, int layer, const float* data, int64_t rows, int64_t cols);
  int64_t files_written() const { return files_; }
  const std::string& dir() const { return dir_; }

 private:
  std::set<std::string> names_;
  bool all_ = false;
  std::string dir_;
  std::FILE* index_ = nullptr;
  int64_t forward_ = -1;
  int64_t files_ = 0;
};

// Reads back a .npy file TensorDump wrote (float32, 1-D or 2-D); shape [rows, cols].
// Throws infera::Error for another format.
std::vector<float> read_npy_f32(const std::string& path, int64_t* rows = nullptr, int64_t* cols = nullptr);

}  // namespace infera
