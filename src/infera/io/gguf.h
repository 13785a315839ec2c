// GGUF v3 (llama.cpp's single-file model format): a streaming writer and an mmap reader.
//
// File layout (all little-endian):
//   "GGUF" u32 version, u64 n_tensors, u64 n_kv
//   n_kv x (string key, u32 value_type, value)        string = u64 length + bytes
//   n_tensors x (string name, u32 n_dims, u64 ne[n_dims] innermost first, u32 ggml_type,
//                u64 offset relative to the data section)
//   padding to `alignment` (general.alignment, default 32), then the data section; every
//   tensor starts at a multiple of `alignment` and is padded to the next one.
//
// A matrix stored [out_features, in_features] row-major has ne = {in, out}.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "infera/base/mmap.h"

namespace infera::gguf {

inline constexpr uint32_t kVersion = 3;
inline constexpr uint64_t kDefaultAlignment = 32;
inline constexpr int kMaxDims = 4;  // GGML_MAX_DIMS

// Metadata value types (gguf_type), numbered as in the file.
enum class ValueType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

std::string_view value_type_name(ValueType t);

// Tensor element types (ggml_type), numbered as in ggml.h. The reader knows the block
// sizes of the common ones so that it can open any llama.cpp GGUF; Infera writes F32,
// F16, BF16 (and later Q8_0 / Q4_0).
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ4_NL = 20,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kBF16 = 30,
};

// Elements per block and bytes per block; {0, 0} for a type this file does not know.
struct GgmlTypeTraits {
  uint32_t block_size = 0;
  uint32_t type_size = 0;
  const char* name = "?";
};
GgmlTypeTraits ggml_type_traits(GgmlType t);
bool is_known_ggml_type(uint32_t t);

// Bytes of a tensor of type `t` with dims `ne` (innermost first). Throws infera::Error
// when ne[0] is not a multiple of the block size or the size overflows.
uint64_t tensor_nbytes(GgmlType t, const std::vector<uint64_t>& ne);

// One metadata value: a scalar, a string, or a homogeneous array of scalars or strings.
// Numeric arrays keep their elements packed exactly as in the file.
class Value {
 public:
  Value() = default;

  static Value u8(uint8_t v);
  static Value i8(int8_t v);
  static Value u16(uint16_t v);
  static Value i16(int16_t v);
  static Value u32(uint32_t v);
  static Value i32(int32_t v);
  static Value u64(uint64_t v);
  static Value i64(int64_t v);
  static Value f32(float v);
  static Value f64(double v);
  static Value boolean(bool v);
  static Value string(std::string v);
  static Value string_array(std::vector<std::string> v);
  // Numeric array of element type `elem` (any scalar type but kString/kArray); the
  // values are converted to `elem` (e.g. array_of(kI32, std::vector<int>{...})).
  template <typename T>
  static Value array_of(ValueType elem, const std::vector<T>& values);
  // Numeric array from packed little-endian elements (what the reader stores).
  static Value raw_array(ValueType elem, std::vector<uint8_t> packed, uint64_t count);

  ValueType type() const { return type_; }
  ValueType element_type() const { return elem_type_; }  // arrays only
  bool is_array() const { return type_ == ValueType::kArray; }
  bool is_integer() const;
  bool is_float() const { return type_ == ValueType::kF32 || type_ == ValueType::kF64; }

  // Typed access; each throws infera::Error (naming the type it found) on a mismatch.
  // Integers convert between widths when the value fits.
  uint64_t to_u64() const;
  int64_t to_i64() const;
  double to_f64() const;  // any numeric scalar
  bool to_bool() const;
  const std::string& str() const;
  uint64_t array_size() const;
  const std::vector<std::string>& str_array() const;
  // Elements of a numeric array converted to double / int64 (bool as 0/1).
  std::vector<double> f64_array() const;
  std::vector<int64_t> i64_array() const;
  const std::vector<uint8_t>& packed() const { return packed_; }
  // A scalar's bytes as stored in the file, zero-extended to 64 bits.
  uint64_t scalar_bits() const { return bits_; }

  // Type, element type and payload bytes are identical (floats compared bitwise).
  bool operator==(const Value& other) const;
  bool operator!=(const Value& other) const { return !(*this == other); }

  // Short human-readable rendering ("u32 512", "str[512]", ...), for logs and errors.
  std::string describe() const;

 private:
  ValueType type_ = ValueType::kU8;
  ValueType elem_type_ = ValueType::kU8;
  uint64_t bits_ = 0;  // scalars: the value's bytes, zero-extended
  std::string string_;
  std::vector<uint8_t> packed_;  // numeric arrays
  std::vector<std::string> strings_;  // string arrays
  uint64_t count_ = 0;  // arrays
  friend class Reader;
};

size_t value_type_size(ValueType t);  // bytes of one scalar element; 0 for string/array

// Metadata in file order.
using Metadata = std::vector<std::pair<std::string, Value>>;

// Receives a tensor's bytes in any number of pieces.
class ByteSink {
 public:
  virtual ~ByteSink() = default;
  virtual void write(const void* data, size_t nbytes) = 0;
};

// Streams a GGUF file: metadata and tensor infos are collected first, then write() lays
// out the header and pulls each tensor's bytes from its producer, so a multi-GB model is
// never held in memory. The file is written to "<path>.tmp" and renamed on success.
class Writer {
 public:
  // Called by write() for one tensor; must hand exactly tensor_nbytes() bytes to `out`.
  using Producer = std::function<void(ByteSink& out)>;
  // Called after each tensor: (tensors done, total tensors, bytes done, total bytes).
  using Progress = std::function<void(size_t, size_t, uint64_t, uint64_t)>;

  // Sets a key; re-setting a key replaces its value in place (order is kept).
  void set(const std::string& key, Value value);
  const Value* find(std::string_view key) const;
  const Metadata& metadata() const { return metadata_; }

  // `ne` innermost first. Throws infera::Error on a duplicate name or bad shape.
  void add_tensor(std::string name, GgmlType type, std::vector<uint64_t> ne, Producer produce);
  // Convenience: bytes that stay valid until write() returns.
  void add_tensor(std::string name, GgmlType type, std::vector<uint64_t> ne, const void* data);
  size_t tensor_count() const { return tensors_.size(); }

  // Alignment from general.alignment when set (must be a power of two), else 32.
  uint64_t alignment() const;

  void write(const std::string& path, const Progress& progress = {}) const;

 private:
  struct PendingTensor {
    std::string name;
    GgmlType type;
    std::vector<uint64_t> ne;
    uint64_t nbytes;
    Producer produce;
  };
  Metadata metadata_;
  std::vector<PendingTensor> tensors_;
};

struct Tensor {
  std::string name;
  GgmlType type = GgmlType::kF32;
  std::vector<uint64_t> ne;  // innermost first
  uint64_t offset = 0;  // from the start of the data section
  uint64_t nbytes = 0;
  const uint8_t* data = nullptr;  // into the mapping; valid while the Reader lives

  uint64_t n_elements() const;
};

// Memory-maps and validates a GGUF file (v2 or v3). Every malformed header field is an
// infera::Error naming the file, the field and the byte offset. load_into_memory: read the
// file into process memory instead of mapping it (`--no-mmap`).
class Reader {
 public:
  // `progress`: the bytes read into memory advance its current step (base/load_progress.h).
  explicit Reader(const std::string& path, bool load_into_memory = false, LoadProgress* progress = nullptr);

  const std::string& path() const { return file_.path(); }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  uint64_t file_size() const { return file_.size(); }

  const Metadata& metadata() const { return metadata_; }
  const Value* find(std::string_view key) const;
  const Value& get(std::string_view key) const;  // throws naming the missing key

  const std::vector<Tensor>& tensors() const { return tensors_; }
  const Tensor* find_tensor(std::string_view name) const;
  const Tensor& tensor(std::string_view name) const;  // throws naming the missing tensor

 private:
  MappedFile file_;
  uint32_t version_ = 0;
  uint64_t alignment_ = kDefaultAlignment;
  uint64_t data_offset_ = 0;
  Metadata metadata_;
  std::vector<Tensor> tensors_;
};

// A split GGUF's file name, "<prefix>-NNNNN-of-MMMMM.gguf" (llama.cpp's gguf-split: 5-digit,
// 1-based part numbers): the path before the tail, the part and the count; nullopt for any
// other name.
struct SplitName {
  std::string prefix;
  int part = 0, count = 0;
};
std::optional<SplitName> parse_split_name(std::string_view path);

// The files of a split GGUF (llama.cpp's gguf-split: "<prefix>-00001-of-00003.gguf"), in
// order, given any one of them; {path} for an ordinary file. Throws infera::Error naming the
// missing parts when some are absent.
std::vector<std::string> split_paths(const std::string& path);

// Whether `path` is a GGUF file: a regular file named *.gguf, or one that starts with the
// magic "GGUF" whatever its name (an Ollama blob, "blobs/sha256-<hex>"). A .gguf file that is
// not valid inside is still one: the reader then names its problem.
bool is_gguf_file(const std::string& path);

// ---- template implementation ----

template <typename T>
Value Value::array_of(ValueType elem, const std::vector<T>& values) {
  std::vector<uint8_t> packed(values.size() * value_type_size(elem));
  uint8_t* p = packed.data();
  for (const T& v : values) {
    switch (elem) {
      case ValueType::kU8: {
        auto x = static_cast<uint8_t>(v);
        std::memcpy(p, &x, 1);
        p += 1;
        break;
      }
      case ValueType::kI8: {
        auto x = static_cast<int8_t>(v);
        std::memcpy(p, &x, 1);
        p += 1;
        break;
      }
      case ValueType::kU16: {
        auto x = static_cast<uint16_t>(v);
        std::memcpy(p, &x, 2);
        p += 2;
        break;
      }
      case ValueType::kI16: {
        auto x = static_cast<int16_t>(v);
        std::memcpy(p, &x, 2);
        p += 2;
        break;
      }
      case ValueType::kU32: {
        auto x = static_cast<uint32_t>(v);
        std::memcpy(p, &x, 4);
        p += 4;
        break;
      }
      case ValueType::kI32: {
        auto x = static_cast<int32_t>(v);
        std::memcpy(p, &x, 4);
        p += 4;
        break;
      }
      case ValueType::kF32: {
        auto x = static_cast<float>(v);
        std::memcpy(p, &x, 4);
        p += 4;
        break;
      }
      case ValueType::kBool: {
        uint8_t x = v ? 1 : 0;
        std::memcpy(p, &x, 1);
        p += 1;
        break;
      }
      case ValueType::kU64: {
        auto x = static_cast<uint64_t>(v);
        std::memcpy(p, &x, 8);
        p += 8;
        break;
      }
      case ValueType::kI64: {
        auto x = static_cast<int64_t>(v);
        std::memcpy(p, &x, 8);
        p += 8;
        break;
      }
      case ValueType::kF64: {
        auto x = static_cast<double>(v);
        std::memcpy(p, &x, 8);
        p += 8;
        break;
      }
      default: return raw_array(elem, {}, 0);  // raw_array throws on a non-numeric element type
    }
  }
  return raw_array(elem, std::move(packed), values.size());
}

}  // namespace infera::gguf
