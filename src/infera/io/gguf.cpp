#include "infera/io/gguf.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <unordered_set>

#include "infera/base/error.h"

namespace infera::gguf {

namespace {

constexpr char kMagic[4] = {'G', 'G', 'U', 'F'};

bool is_power_of_two(uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }

uint64_t align_up(uint64_t x, uint64_t alignment) { return (x + alignment - 1) / alignment * alignment; }

bool is_scalar_type(ValueType t) { return t != ValueType::kString && t != ValueType::kArray; }

}  // namespace

std::string_view value_type_name(ValueType t) {
  switch (t) {
    case ValueType::kU8: return "u8";
    case ValueType::kI8: return "i8";
    case ValueType::kU16: return "u16";
    case ValueType::kI16: return "i16";
    case ValueType::kU32: return "u32";
    case ValueType::kI32: return "i32";
    case ValueType::kF32: return "f32";
    case ValueType::kBool: return "bool";
    case ValueType::kString: return "str";
    case ValueType::kArray: return "arr";
    case ValueType::kU64: return "u64";
    case ValueType::kI64: return "i64";
    case ValueType::kF64: return "f64";
  }
  return "?";
}

size_t value_type_size(ValueType t) {
  switch (t) {
    case ValueType::kU8:
    case ValueType::kI8:
    case ValueType::kBool: return 1;
    case ValueType::kU16:
    case ValueType::kI16: return 2;
    case ValueType::kU32:
    case ValueType::kI32:
    case ValueType::kF32: return 4;
    case ValueType::kU64:
    case ValueType::kI64:
    case ValueType::kF64: return 8;
    case ValueType::kString:
    case ValueType::kArray: return 0;
  }
  return 0;
}

GgmlTypeTraits ggml_type_traits(GgmlType t) {
  switch (t) {
    case GgmlType::kF32: return {1, 4, "F32"};
    case GgmlType::kF16: return {1, 2, "F16"};
    case GgmlType::kBF16: return {1, 2, "BF16"};
    case GgmlType::kQ4_0: return {32, 18, "Q4_0"};
    case GgmlType::kQ4_1: return {32, 20, "Q4_1"};
    case GgmlType::kQ5_0: return {32, 22, "Q5_0"};
    case GgmlType::kQ5_1: return {32, 24, "Q5_1"};
    case GgmlType::kQ8_0: return {32, 34, "Q8_0"};
    case GgmlType::kQ8_1: return {32, 36, "Q8_1"};
    case GgmlType::kQ2_K: return {256, 84, "Q2_K"};
    case GgmlType::kQ3_K: return {256, 110, "Q3_K"};
    case GgmlType::kQ4_K: return {256, 144, "Q4_K"};
    case GgmlType::kQ5_K: return {256, 176, "Q5_K"};
    case GgmlType::kQ6_K: return {256, 210, "Q6_K"};
    case GgmlType::kQ8_K: return {256, 292, "Q8_K"};
    case GgmlType::kIQ4_NL: return {32, 18, "IQ4_NL"};
    case GgmlType::kIQ4_XS: return {256, 136, "IQ4_XS"};
    case GgmlType::kI8: return {1, 1, "I8"};
    case GgmlType::kI16: return {1, 2, "I16"};
    case GgmlType::kI32: return {1, 4, "I32"};
    case GgmlType::kI64: return {1, 8, "I64"};
    case GgmlType::kF64: return {1, 8, "F64"};
  }
  return {};
}

bool is_known_ggml_type(uint32_t t) { return ggml_type_traits(static_cast<GgmlType>(t)).block_size != 0; }

uint64_t tensor_nbytes(GgmlType t, const std::vector<uint64_t>& ne) {
  const GgmlTypeTraits tr = ggml_type_traits(t);
  if (tr.block_size == 0) fail("unsupported ggml type {}", static_cast<uint32_t>(t));
  if (ne.empty() || ne.size() > static_cast<size_t>(kMaxDims))
    fail("tensor has {} dims, expected 1..{}", ne.size(), kMaxDims);
  if (ne[0] % tr.block_size != 0) {
    fail("tensor row of {} elements is not a multiple of the {} block size {}", ne[0], tr.name, tr.block_size);
  }
  // Sizes are checked against 2^62 so that later offset arithmetic cannot overflow.
  // Every dimension counts, a zero one too: the element count (n_elements) and the shape
  // products readers form must not wrap either, whatever the byte size.
  constexpr uint64_t kLimit = uint64_t{1} << 62;
  if (ne[0] / tr.block_size > kLimit / tr.type_size) fail("tensor size overflows");
  uint64_t bytes = ne[0] / tr.block_size * tr.type_size;
  uint64_t elements = std::max<uint64_t>(ne[0], 1);
  for (size_t i = 1; i < ne.size(); ++i) {
    const uint64_t d = std::max<uint64_t>(ne[i], 1);
    if (bytes > kLimit / d || elements > kLimit / d) fail("tensor size overflows");
    bytes *= ne[i];
    elements *= d;
  }
  return bytes;
}

uint64_t Tensor::n_elements() const {
  uint64_t n = 1;
  for (uint64_t d : ne) n *= d;
  return n;
}

// ---------------------------------------------------------------------------- Value

#define INFERA_GGUF_SCALAR(fn, ctype, vtype) \
  Value Value::fn(ctype v) {                 \
    Value out;                               \
    out.type_ = vtype;                       \
    std::memcpy(&out.bits_, &v, sizeof(v));  \
    return out;                              \
  }
INFERA_GGUF_SCALAR(u8, uint8_t, ValueType::kU8)
INFERA_GGUF_SCALAR(i8, int8_t, ValueType::kI8)
INFERA_GGUF_SCALAR(u16, uint16_t, ValueType::kU16)
INFERA_GGUF_SCALAR(i16, int16_t, ValueType::kI16)
INFERA_GGUF_SCALAR(u32, uint32_t, ValueType::kU32)
INFERA_GGUF_SCALAR(i32, int32_t, ValueType::kI32)
INFERA_GGUF_SCALAR(u64, uint64_t, ValueType::kU64)
INFERA_GGUF_SCALAR(i64, int64_t, ValueType::kI64)
INFERA_GGUF_SCALAR(f32, float, ValueType::kF32)
INFERA_GGUF_SCALAR(f64, double, ValueType::kF64)
#undef INFERA_GGUF_SCALAR

Value Value::boolean(bool v) {
  Value out;
  out.type_ = ValueType::kBool;
  out.bits_ = v ? 1 : 0;
  return out;
}

Value Value::string(std::string v) {
  Value out;
  out.type_ = ValueType::kString;
  out.string_ = std::move(v);
  return out;
}

Value Value::string_array(std::vector<std::string> v) {
  Value out;
  out.type_ = ValueType::kArray;
  out.elem_type_ = ValueType::kString;
  out.count_ = v.size();
  out.strings_ = std::move(v);
  return out;
}

Value Value::raw_array(ValueType elem, std::vector<uint8_t> packed, uint64_t count) {
  if (!is_scalar_type(elem)) fail("GGUF numeric array cannot have element type {}", value_type_name(elem));
  INFERA_ASSERT(packed.size() == count * value_type_size(elem), "packed array size mismatch");
  Value out;
  out.type_ = ValueType::kArray;
  out.elem_type_ = elem;
  out.count_ = count;
  out.packed_ = std::move(packed);
  return out;
}

bool Value::is_integer() const {
  switch (type_) {
    case ValueType::kU8:
    case ValueType::kI8:
    case ValueType::kU16:
    case ValueType::kI16:
    case ValueType::kU32:
    case ValueType::kI32:
    case ValueType::kU64:
    case ValueType::kI64: return true;
    default: return false;
  }
}

namespace {

// Reads one packed scalar of type t as a signed/unsigned pair: returns true when the
// value is negative (then `s` holds it), else `u` holds it.
void decode_integer(ValueType t, const void* p, bool* negative, uint64_t* u, int64_t* s) {
  *negative = false;
  *u = 0;
  *s = 0;
  switch (t) {
    case ValueType::kU8: {
      uint8_t v;
      std::memcpy(&v, p, 1);
      *u = v;
      break;
    }
    case ValueType::kU16: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      *u = v;
      break;
    }
    case ValueType::kU32: {
      uint32_t v;
      std::memcpy(&v, p, 4);
      *u = v;
      break;
    }
    case ValueType::kU64: {
      uint64_t v;
      std::memcpy(&v, p, 8);
      *u = v;
      break;
    }
    case ValueType::kBool: {
      uint8_t v;
      std::memcpy(&v, p, 1);
      *u = v ? 1 : 0;
      break;
    }
    case ValueType::kI8: {
      int8_t v;
      std::memcpy(&v, p, 1);
      *s = v;
      break;
    }
    case ValueType::kI16: {
      int16_t v;
      std::memcpy(&v, p, 2);
      *s = v;
      break;
    }
    case ValueType::kI32: {
      int32_t v;
      std::memcpy(&v, p, 4);
      *s = v;
      break;
    }
    case ValueType::kI64: {
      int64_t v;
      std::memcpy(&v, p, 8);
      *s = v;
      break;
    }
    default: break;
  }
  if (t == ValueType::kI8 || t == ValueType::kI16 || t == ValueType::kI32 || t == ValueType::kI64) {
    if (*s < 0)
      *negative = true;
    else
      *u = static_cast<uint64_t>(*s);
  }
}

double decode_number(ValueType t, const void* p) {
  if (t == ValueType::kF32) {
    float v;
    std::memcpy(&v, p, 4);
    return v;
  }
  if (t == ValueType::kF64) {
    double v;
    std::memcpy(&v, p, 8);
    return v;
  }
  bool negative;
  uint64_t u;
  int64_t s;
  decode_integer(t, p, &negative, &u, &s);
  return negative ? static_cast<double>(s) : static_cast<double>(u);
}

}  // namespace

uint64_t Value::to_u64() const {
  if (!is_integer()) fail("expected an integer GGUF value, found {}", describe());
  bool negative;
  uint64_t u;
  int64_t s;
  decode_integer(type_, &bits_, &negative, &u, &s);
  if (negative) fail("expected a non-negative integer GGUF value, found {}", describe());
  return u;
}

int64_t Value::to_i64() const {
  if (!is_integer()) fail("expected an integer GGUF value, found {}", describe());
  bool negative;
  uint64_t u;
  int64_t s;
  decode_integer(type_, &bits_, &negative, &u, &s);
  if (negative) return s;
  if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) fail("GGUF value {} does not fit in int64", u);
  return static_cast<int64_t>(u);
}

double Value::to_f64() const {
  if (!is_integer() && !is_float()) fail("expected a numeric GGUF value, found {}", describe());
  return decode_number(type_, &bits_);
}

bool Value::to_bool() const {
  if (type_ != ValueType::kBool) fail("expected a bool GGUF value, found {}", describe());
  return bits_ != 0;
}

const std::string& Value::str() const {
  if (type_ != ValueType::kString) fail("expected a string GGUF value, found {}", describe());
  return string_;
}

uint64_t Value::array_size() const {
  if (type_ != ValueType::kArray) fail("expected a GGUF array, found {}", describe());
  return count_;
}

const std::vector<std::string>& Value::str_array() const {
  if (type_ != ValueType::kArray || elem_type_ != ValueType::kString) {
    fail("expected a GGUF string array, found {}", describe());
  }
  return strings_;
}

std::vector<double> Value::f64_array() const {
  if (type_ != ValueType::kArray || elem_type_ == ValueType::kString) {
    fail("expected a numeric GGUF array, found {}", describe());
  }
  const size_t es = value_type_size(elem_type_);
  std::vector<double> out(count_);
  for (uint64_t i = 0; i < count_; ++i) out[i] = decode_number(elem_type_, packed_.data() + i * es);
  return out;
}

std::vector<int64_t> Value::i64_array() const {
  if (type_ != ValueType::kArray || elem_type_ == ValueType::kString || elem_type_ == ValueType::kF32 ||
      elem_type_ == ValueType::kF64) {
    fail("expected an integer GGUF array, found {}", describe());
  }
  const size_t es = value_type_size(elem_type_);
  std::vector<int64_t> out(count_);
  for (uint64_t i = 0; i < count_; ++i) {
    bool negative;
    uint64_t u;
    int64_t s;
    decode_integer(elem_type_, packed_.data() + i * es, &negative, &u, &s);
    out[i] = negative ? s : static_cast<int64_t>(u);
  }
  return out;
}

bool Value::operator==(const Value& o) const {
  if (type_ != o.type_) return false;
  if (type_ == ValueType::kString) return string_ == o.string_;
  if (type_ == ValueType::kArray) {
    return elem_type_ == o.elem_type_ && count_ == o.count_ && packed_ == o.packed_ && strings_ == o.strings_;
  }
  return bits_ == o.bits_;
}

std::string Value::describe() const {
  switch (type_) {
    case ValueType::kString: {
      std::string s = string_.size() > 60 ? string_.substr(0, 57) + "..." : string_;
      return fmt::format("str \"{}\"", s);
    }
    case ValueType::kArray: return fmt::format("{}[{}]", value_type_name(elem_type_), count_);
    case ValueType::kBool: return bits_ ? "bool true" : "bool false";
    case ValueType::kF32:
    case ValueType::kF64: return fmt::format("{} {}", value_type_name(type_), decode_number(type_, &bits_));
    default: {
      bool negative;
      uint64_t u;
      int64_t s;
      decode_integer(type_, &bits_, &negative, &u, &s);
      return negative ? fmt::format("{} {}", value_type_name(type_), s)
                      : fmt::format("{} {}", value_type_name(type_), u);
    }
  }
}

// ---------------------------------------------------------------------------- Writer

namespace {

// Buffered file output with one error message style.
class FileOut final : public ByteSink {
 public:
  explicit FileOut(const std::string& path) : path_(path) {
    f_ = std::fopen(path.c_str(), "wb");
    if (!f_) fail("{}: cannot create: {}", path, std::strerror(errno));
    std::setvbuf(f_, nullptr, _IOFBF, 1 << 20);
  }
  ~FileOut() override {
    if (f_) std::fclose(f_);
  }
  void write(const void* data, size_t n) override {
    if (n == 0) return;
    if (std::fwrite(data, 1, n, f_) != n) fail("{}: write failed: {}", path_, std::strerror(errno));
    pos_ += n;
  }
  template <typename T>
  void put(T v) {
    write(&v, sizeof(v));
  }
  void put_string(const std::string& s) {
    put<uint64_t>(s.size());
    write(s.data(), s.size());
  }
  void pad_to(uint64_t alignment) {
    static const uint8_t zeros[256] = {};
    uint64_t target = align_up(pos_, alignment);
    while (pos_ < target) write(zeros, std::min<uint64_t>(sizeof(zeros), target - pos_));
  }
  void close() {
    if (std::fflush(f_) != 0 || std::fclose(f_) != 0) {
      f_ = nullptr;
      fail("{}: write failed: {}", path_, std::strerror(errno));
    }
    f_ = nullptr;
  }
  uint64_t pos() const { return pos_; }

 private:
  std::string path_;
  FILE* f_ = nullptr;
  uint64_t pos_ = 0;
};

// Counts what a producer hands over so a short or long tensor is caught by name.
class CountingSink final : public ByteSink {
 public:
  CountingSink(FileOut& out, const std::string& name, uint64_t expected)
      : out_(out), name_(name), expected_(expected) {}
  void write(const void* data, size_t n) override {
    if (written_ + n > expected_) {
      fail("GGUF writer: tensor '{}' got more than its {} bytes", name_, expected_);
    }
    out_.write(data, n);
    written_ += n;
  }
  uint64_t written() const { return written_; }

 private:
  FileOut& out_;
  const std::string& name_;
  uint64_t expected_;
  uint64_t written_ = 0;
};

void write_value(FileOut& out, const Value& v) {
  switch (v.type()) {
    case ValueType::kString: out.put_string(v.str()); break;
    case ValueType::kArray:
      out.put<uint32_t>(static_cast<uint32_t>(v.element_type()));
      out.put<uint64_t>(v.array_size());
      if (v.element_type() == ValueType::kString) {
        for (const std::string& s : v.str_array()) out.put_string(s);
      } else {
        out.write(v.packed().data(), v.packed().size());
      }
      break;
    default: {
      // Scalars: the low value_type_size bytes (little-endian host).
      const uint64_t bits = v.scalar_bits();
      out.write(&bits, value_type_size(v.type()));
    }
  }
}

}  // namespace

void Writer::set(const std::string& key, Value value) {
  if (key.empty()) fail("GGUF writer: empty metadata key");
  for (auto& [k, v] : metadata_) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  metadata_.emplace_back(key, std::move(value));
}

const Value* Writer::find(std::string_view key) const {
  for (const auto& [k, v] : metadata_) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Writer::add_tensor(std::string name, GgmlType type, std::vector<uint64_t> ne, Producer produce) {
  if (name.empty()) fail("GGUF writer: empty tensor name");
  // llama.cpp keeps names in a fixed 64-byte buffer (GGML_MAX_NAME).
  if (name.size() >= 64) fail("GGUF writer: tensor name '{}' is longer than 63 bytes", name);
  for (const PendingTensor& t : tensors_) {
    if (t.name == name) fail("GGUF writer: duplicate tensor '{}'", name);
  }
  uint64_t nbytes;
  try {
    nbytes = tensor_nbytes(type, ne);
  } catch (const Error& e) {
    fail("GGUF writer: tensor '{}': {}", name, e.what());
  }
  tensors_.push_back({std::move(name), type, std::move(ne), nbytes, std::move(produce)});
}

void Writer::add_tensor(std::string name, GgmlType type, std::vector<uint64_t> ne, const void* data) {
  const uint64_t nbytes = tensor_nbytes(type, ne);
  add_tensor(std::move(name), type, std::move(ne), [data, nbytes](ByteSink& out) { out.write(data, nbytes); });
}

uint64_t Writer::alignment() const {
  const Value* v = find("general.alignment");
  if (!v) return kDefaultAlignment;
  if (v->type() != ValueType::kU32) fail("GGUF writer: general.alignment must be u32, is {}", v->describe());
  const uint64_t a = v->to_u64();
  if (!is_power_of_two(a)) fail("GGUF writer: general.alignment {} is not a power of two", a);
  return a;
}

void Writer::write(const std::string& path, const Progress& progress) const {
  const uint64_t alignment = this->alignment();
  const std::string tmp_path = path + ".tmp";
  uint64_t total_bytes = 0;
  for (const PendingTensor& t : tensors_) total_bytes = align_up(total_bytes, alignment) + t.nbytes;
  try {
    FileOut out(tmp_path);
    out.write(kMagic, 4);
    out.put<uint32_t>(kVersion);
    out.put<uint64_t>(tensors_.size());
    out.put<uint64_t>(metadata_.size());
    for (const auto& [key, value] : metadata_) {
      out.put_string(key);
      out.put<uint32_t>(static_cast<uint32_t>(value.type()));
      write_value(out, value);
    }
    uint64_t offset = 0;
    for (const PendingTensor& t : tensors_) {
      out.put_string(t.name);
      out.put<uint32_t>(static_cast<uint32_t>(t.ne.size()));
      for (uint64_t d : t.ne) out.put<uint64_t>(d);
      out.put<uint32_t>(static_cast<uint32_t>(t.type));
      offset = align_up(offset, alignment);
      out.put<uint64_t>(offset);
      offset += t.nbytes;
    }
    out.pad_to(alignment);
    const uint64_t data_start = out.pos();
    uint64_t done = 0;
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const PendingTensor& t = tensors_[i];
      out.pad_to(alignment);
      INFERA_ASSERT(out.pos() - data_start == align_up(done, alignment), "GGUF writer offset drift");
      CountingSink sink(out, t.name, t.nbytes);
      t.produce(sink);
      if (sink.written() != t.nbytes) {
        fail("GGUF writer: tensor '{}' got {} bytes, expected {}", t.name, sink.written(), t.nbytes);
      }
      done = out.pos() - data_start;
      if (progress) progress(i + 1, tensors_.size(), done, total_bytes);
    }
    // Pad the last tensor too, as llama.cpp's writer does.
    if (!tensors_.empty()) out.pad_to(alignment);
    out.close();
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove(tmp_path, ec);
    throw;
  }
  std::error_code ec;
  std::filesystem::rename(tmp_path, path, ec);
  if (ec) {
    std::filesystem::remove(tmp_path, ec);
    fail("{}: cannot rename the finished file into place: {}", path, ec.message());
  }
}

// ---------------------------------------------------------------------------- Reader

namespace {

// Bounds-checked cursor over the mapped header.
class Cursor {
 public:
  Cursor(const uint8_t* data, uint64_t size, const std::string& path) : data_(data), size_(size), path_(path) {}

  template <typename T>
  T get(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string get_string(const char* what) {
    const uint64_t n = get<uint64_t>(what);
    need(n, what);
    std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return s;
  }
  void need(uint64_t n, const char* what) const {
    if (n > size_ - pos_) {
      fail("{}: truncated GGUF header: {} at byte {} needs {} bytes, file has {} (is the file complete?)", path_, what,
           pos_, n, size_);
    }
  }
  const uint8_t* here() const { return data_ + pos_; }
  void skip(uint64_t n) { pos_ += n; }
  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }
  const std::string& path() const { return path_; }

 private:
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& path_;
};

bool valid_value_type(uint32_t t) { return t <= static_cast<uint32_t>(ValueType::kF64); }

}  // namespace

Reader::Reader(const std::string& path, bool load_into_memory, LoadProgress* progress)
    : file_(path, load_into_memory, progress) {
  Cursor c(file_.data(), file_.size(), file_.path());
  if (file_.size() < 4 || std::memcmp(file_.data(), kMagic, 4) != 0) {
    fail("{}: not a GGUF file (the first 4 bytes are not \"GGUF\")", path);
  }
  c.skip(4);
  version_ = c.get<uint32_t>("version");
  if (version_ == 1) fail("{}: GGUF version 1 is not supported; re-convert it with a current converter", path);
  if (version_ != 2 && version_ != 3) {
    fail("{}: unsupported GGUF version {} (Infera reads versions 2 and 3)", path, version_);
  }
  const uint64_t n_tensors = c.get<uint64_t>("tensor count");
  const uint64_t n_kv = c.get<uint64_t>("metadata count");
  // Every entry takes at least 8 bytes: counts beyond the file size are garbage, and
  // catching them here avoids a giant reserve().
  if (n_tensors > c.remaining() / 8 || n_kv > c.remaining() / 8) {
    fail("{}: corrupt GGUF header: {} tensors and {} metadata entries cannot fit in {} bytes", path, n_tensors, n_kv,
         file_.size());
  }

  std::unordered_set<std::string> seen_keys;
  metadata_.reserve(n_kv);
  for (uint64_t i = 0; i < n_kv; ++i) {
    const uint64_t at = c.pos();
    std::string key = c.get_string("metadata key");
    const uint32_t type = c.get<uint32_t>("metadata value type");
    if (!valid_value_type(type)) fail("{}: metadata '{}' (byte {}) has unknown value type {}", path, key, at, type);
    if (!seen_keys.insert(key).second) fail("{}: duplicate metadata key '{}'", path, key);
    Value v;
    const auto vt = static_cast<ValueType>(type);
    if (vt == ValueType::kString) {
      v = Value::string(c.get_string("metadata string"));
    } else if (vt == ValueType::kArray) {
      const uint32_t et = c.get<uint32_t>("array element type");
      if (!valid_value_type(et)) fail("{}: metadata '{}' is an array of unknown type {}", path, key, et);
      const auto elem = static_cast<ValueType>(et);
      if (elem == ValueType::kArray) fail("{}: metadata '{}' is a nested array, which Infera does not read", path, key);
      const uint64_t n = c.get<uint64_t>("array length");
      if (elem == ValueType::kString) {
        if (n > c.remaining() / 8) fail("{}: metadata '{}' claims {} strings, more than the file holds", path, key, n);
        std::vector<std::string> strings;
        strings.reserve(n);
        for (uint64_t j = 0; j < n; ++j) strings.push_back(c.get_string("array string"));
        v = Value::string_array(std::move(strings));
      } else {
        const size_t es = value_type_size(elem);
        if (n > c.remaining() / es)
          fail("{}: metadata '{}' claims {} elements, more than the file holds", path, key, n);
        std::vector<uint8_t> packed(c.here(), c.here() + n * es);
        c.skip(n * es);
        v = Value::raw_array(elem, std::move(packed), n);
      }
    } else {
      const size_t n = value_type_size(vt);
      c.need(n, "metadata value");
      Value scalar;
      scalar.type_ = vt;
      std::memcpy(&scalar.bits_, c.here(), n);
      c.skip(n);
      v = std::move(scalar);
    }
    metadata_.emplace_back(std::move(key), std::move(v));
  }

  if (const Value* a = find("general.alignment")) {
    if (a->type() != ValueType::kU32 || !is_power_of_two(a->to_u64())) {
      fail("{}: general.alignment must be a power-of-two u32, found {}", path, a->describe());
    }
    alignment_ = a->to_u64();
  }

  std::unordered_set<std::string> seen_tensors;
  tensors_.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    Tensor t;
    t.name = c.get_string("tensor name");
    if (!seen_tensors.insert(t.name).second) fail("{}: duplicate tensor '{}'", path, t.name);
    const uint32_t n_dims = c.get<uint32_t>("tensor dims");
    if (n_dims == 0 || n_dims > static_cast<uint32_t>(kMaxDims)) {
      fail("{}: tensor '{}' has {} dims, expected 1..{}", path, t.name, n_dims, kMaxDims);
    }
    t.ne.resize(n_dims);
    for (uint32_t d = 0; d < n_dims; ++d) t.ne[d] = c.get<uint64_t>("tensor shape");
    const uint32_t type = c.get<uint32_t>("tensor type");
    if (!is_known_ggml_type(type)) fail("{}: tensor '{}' has unsupported ggml type {}", path, t.name, type);
    t.type = static_cast<GgmlType>(type);
    t.offset = c.get<uint64_t>("tensor offset");
    if (t.offset % alignment_ != 0) {
      fail("{}: tensor '{}' offset {} is not a multiple of the alignment {}", path, t.name, t.offset, alignment_);
    }
    try {
      t.nbytes = tensor_nbytes(t.type, t.ne);
    } catch (const Error& e) {
      fail("{}: tensor '{}': {}", path, t.name, e.what());
    }
    tensors_.push_back(std::move(t));
  }

  data_offset_ = align_up(c.pos(), alignment_);
  for (Tensor& t : tensors_) {
    const uint64_t size = file_.size();
    if (data_offset_ > size || t.offset > size - data_offset_ || t.nbytes > size - data_offset_ - t.offset) {
      fail("{}: tensor '{}' ({} bytes at data offset {}) runs past the end of the {}-byte file (truncated download?)",
           path, t.name, t.nbytes, t.offset, size);
    }
    t.data = file_.data() + data_offset_ + t.offset;
  }
}

std::optional<SplitName> parse_split_name(std::string_view path) {
  constexpr std::string_view kSuffix = ".gguf";
  constexpr size_t kTail = 1 + 5 + 4 + 5;  // "-00001-of-00003"
  if (!path.ends_with(kSuffix) || path.size() < kSuffix.size() + kTail) return std::nullopt;
  const std::string_view stem = path.substr(0, path.size() - kSuffix.size());
  const std::string_view tail = stem.substr(stem.size() - kTail);
  const auto digits = [](std::string_view s) { return s.find_first_not_of("0123456789") == std::string_view::npos; };
  if (tail[0] != '-' || tail.substr(6, 4) != "-of-" || !digits(tail.substr(1, 5)) || !digits(tail.substr(10, 5))) {
    return std::nullopt;
  }
  return SplitName{std::string(stem.substr(0, stem.size() - kTail)), std::stoi(std::string(tail.substr(1, 5))),
                   std::stoi(std::string(tail.substr(10, 5)))};
}

std::vector<std::string> split_paths(const std::string& path) {
  const std::optional<SplitName> name = parse_split_name(path);
  if (!name) return {path};
  const int count = name->count;
  if (count < 1) fail("{}: split count 0 in the file name", path);
  const std::string& prefix = name->prefix;
  std::vector<std::string> paths, missing;
  for (int i = 1; i <= count; ++i) {
    paths.push_back(fmt::format("{}-{:05d}-of-{:05d}.gguf", prefix, i, count));
    std::error_code ec;
    if (!std::filesystem::is_regular_file(paths.back(), ec)) missing.push_back(paths.back());
  }
  if (!missing.empty()) {
    fail("{}: {} of the {} parts of this split GGUF are missing (first: {}); download every part", path, missing.size(),
         count, missing.front());
  }
  return paths;
}

bool is_gguf_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  if (std::string_view(path).ends_with(".gguf")) return true;
  char magic[4] = {};
  std::ifstream in(path, std::ios::binary);
  return in.read(magic, sizeof magic) && std::memcmp(magic, "GGUF", sizeof magic) == 0;
}

const Value* Reader::find(std::string_view key) const {
  for (const auto& [k, v] : metadata_) {
    if (k == key) return &v;
  }
  return nullptr;
}

const Value& Reader::get(std::string_view key) const {
  const Value* v = find(key);
  if (!v) fail("{}: GGUF metadata key '{}' is missing", path(), key);
  return *v;
}

const Tensor* Reader::find_tensor(std::string_view name) const {
  for (const Tensor& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

const Tensor& Reader::tensor(std::string_view name) const {
  const Tensor* t = find_tensor(name);
  if (!t) fail("{}: GGUF tensor '{}' is missing", path(), name);
  return *t;
}

}  // namespace infera::gguf
