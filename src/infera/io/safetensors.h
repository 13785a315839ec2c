// safetensors reader and writer.
//
// File layout (https://huggingface.co/docs/safetensors): 8-byte little-endian header
// length N, N bytes of JSON header {name: {dtype, shape, data_offsets: [begin, end]},
// "__metadata__": {str: str}}, then the data section; offsets are relative to its start.
//
// WeightStore maps (or reads) every shard of a model directory once; TensorInfo::data
// points straight into that memory, so a tensor whose stored dtype is the compute dtype
// is used without a copy. Every structural problem of a file is reported as one
// infera::Error naming the file and the problem; nothing in a file can make the reader
// touch memory outside the file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "infera/tensor/dtype.h"

namespace infera {

class LoadProgress;

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // into the mapped (or loaded) file; nullptr from read_safetensors_header
  size_t nbytes = 0;
  std::string file;  // shard file name, relative to the model directory
  uint32_t ggml_type = 0;  // dtype kGgml (a GGUF tensor in llama.cpp's block format): its ggml type

  int64_t numel() const;
};

// "[a, b, c]" for error messages.
std::string shape_string(const std::vector<int64_t>& shape);

// Throws "<file>: tensor 'X' has shape [a, b], config.json implies [c, d]" on mismatch.
// `file` is the path used in the message (WeightStore passes <dir>/<shard>); empty: tensor.file.
void check_shape(const TensorInfo& tensor, std::initializer_list<int64_t> expected_shape, const std::string& file = "");

// All safetensors shards of one model directory.
class WeightStore {
 public:
  WeightStore();
  ~WeightStore();
  WeightStore(WeightStore&&) noexcept;
  WeightStore& operator=(WeightStore&&) noexcept;
  WeightStore(const WeightStore&) = delete;
  WeightStore& operator=(const WeightStore&) = delete;

  // Opens <model_dir>/model.safetensors.index.json (sharded: every file named in its
  // weight_map) or else <model_dir>/model.safetensors. load_into_memory: read the files
  // into process memory instead of mmapping them (steadier decode under page-cache pressure);
  // with `progress`, that reading is its "reading" step (base/load_progress.h).
  static WeightStore open(const std::string& model_dir, bool load_into_memory = false,
                          LoadProgress* progress = nullptr);
  // A store over tensors another reader found (a GGUF file's, under their Hugging Face
  // names): every TensorInfo::data points into memory `owner` keeps alive. `source` stands
  // for dir() in messages; mapped_bytes: the size of the files behind them.
  static WeightStore from_tensors(std::string source, std::vector<TensorInfo> tensors,
                                  std::shared_ptr<const void> owner, size_t mapped_bytes);

  const TensorInfo* find(std::string_view name) const;  // nullptr if absent
  // Throws "<dir>: tensor 'X' not found (...hint...)".
  const TensorInfo& get(std::string_view name) const;
  // get() + check_shape().
  const TensorInfo& get(std::string_view name, std::initializer_list<int64_t> expected_shape) const;

  std::vector<std::string> names() const;  // sorted
  size_t size() const;  // number of tensors
  size_t total_bytes() const;  // sum of tensor bytes
  size_t mapped_bytes() const;  // sum of file sizes
  const std::string& dir() const;
  // "__metadata__" of every file merged (the first file in name order wins on conflicts).
  const std::map<std::string, std::string>& metadata() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;
};

// Writes one safetensors file (through <path>.tmp + rename, so a failed write never leaves
// a half file under `path`). As the reference implementation does, tensors are laid out
// by decreasing element size, then by name, so every tensor is naturally aligned; the
// header is padded with spaces to a multiple of 8 bytes. Throws on duplicate names, a
// byte count that does not match shape * element size, or an I/O error.
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Parses and validates only the header of one file (for `infera check`): tensors in file
// order with data = nullptr and file = `path`; offsets are checked against the file size.
std::vector<TensorInfo> read_safetensors_header(const std::string& path);

// safetensors dtype string ("F32", "BF16", ...) for a DType.
std::string_view safetensors_dtype_name(DType dtype);

}  // namespace infera
