// Running llama.cpp GGUF files: the model configuration from the per-architecture metadata
// keys and the weights under their Hugging Face names, so that the model files bind a GGUF
// exactly as they bind a safetensors checkpoint.
//
// The registry row whose gguf_arch equals general.architecture selects the architecture;
// its tensor table (model/tensor_table.h) gives each tensor's GGUF name, and its traits
// which family keys to read (hybrid: ssm.*, MLA: *_mla, kv_lora_rank, indexer.*). What
// llama.cpp's converter baked into the weights is undone at load:
//   - llama: q/k rows were permuted for llama.cpp's adjacent-pair rope; they are put back
//     in Hugging Face order (rotate_half pairing, which Infera's kernels use);
//   - the table row's TensorSpec::gguf_form: Qwen3.5's 1 + w norms, -exp(A_log), value
//     heads tiled instead of grouped, conv1d's shape; DeepSeek's kv_b_proj split into
//     attn_k_b / attn_v_b;
//   - stacked experts (ffn_{gate,up,down}_exps, ne = {in, out, E}) are viewed per expert;
//   - Llama 3's rope_freqs.weight becomes RopeConfig::freq_factors.
// Tensors are used in place (mapped, or read into memory with --no-mmap): F32 / F16 / BF16
// as those dtypes, matrices of llama.cpp's block types (Q8_0, Q4_K, ...) as DType::kGgml,
// which the kernels multiply with int8 activations as llama.cpp does
// (kernels/ggml_quants.h). Split files ("<prefix>-00001-of-00003.gguf") load as one model.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "infera/io/safetensors.h"
#include "infera/model/config.h"

namespace infera {

// True when `path` names a GGUF file: a regular file ending in ".gguf", or one starting with
// the GGUF magic whatever its name (gguf::is_gguf_file: an Ollama blob).
bool is_gguf_path(const std::string& path);

// The configuration of the GGUF model at `path` (any part of a split file). Throws
// infera::Error naming the file and the key for an unsupported architecture or a missing
// or malformed key.
ModelConfig gguf_model_config(const std::string& path);

// The weights of the GGUF model at `path`, named as the architecture's tensor table names
// them for `cfg` (from gguf_model_config). Throws infera::Error naming the tensor for a
// missing tensor, a shape that disagrees with the metadata, or a tensor type Infera cannot
// compute with. With `progress`: reading the files into memory (load_into_memory) is its
// "reading" step and binding the tensors its "converting" step (base/load_progress.h).
WeightStore open_gguf_weights(const std::string& path, const ModelConfig& cfg, bool load_into_memory = false,
                              LoadProgress* progress = nullptr);

// What open_gguf_weights would bind, from the headers alone (`infera check`, `infera plan`):
// every check it makes, without reading or converting a tensor.
struct GgufWeightsSummary {
  int64_t tensors = 0;  // bound tensors (a stacked expert tensor counts once)
  int64_t parameters = 0;
  int64_t file_bytes = 0;  // of every part
  int64_t resident_bytes = 0;  // weights in memory once loaded (dequantized tensors as f32)
  std::map<std::string, int64_t> types;  // ggml type name -> tensors
  // The block-type matrices a tensor-parallel group splits by their input columns (the
  // table's TpSplit::kColumns, and the experts' down projections), which must split on
  // whole blocks (TensorShard::check_split). One per GGUF tensor.
  struct ColumnSplit {
    std::string gguf;  // GGUF name
    std::string slot;  // TensorSpec::slot: which dimension splits them
    int64_t cols = 0;
    uint32_t ggml_type = 0;
  };
  std::vector<ColumnSplit> column_splits;
};
GgufWeightsSummary inspect_gguf_weights(const std::string& path, const ModelConfig& cfg);

}  // namespace infera
