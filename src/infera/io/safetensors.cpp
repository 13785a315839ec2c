#include "infera/io/safetensors.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "infera/base/error.h"
#include "infera/base/json_file.h"
#include "infera/base/load_progress.h"
#include "infera/base/mmap.h"

namespace infera {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// A real header holds a few hundred bytes per tensor: even DeepSeek-V3 shards stay far
// below this. A larger length means a corrupt file or not a safetensors file at all, and
// must not make us allocate or parse gigabytes.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";
// Ascend msModelSlim's names for the same two layouts (beside quant_model_description.json).
constexpr const char* kSlimSingleFile = "quant_model_weights.safetensors";
constexpr const char* kSlimIndexFile = "quant_model_weights.safetensors.index.json";

bool parse_dtype(std::string_view name, DType* out) {
  // F8_E4M3: float8 e4m3fn weights of pre-quantized checkpoints (model/prequant.h); BOOL: one
  // byte per element, 0 or 1.
  static const std::pair<std::string_view, DType> kTable[] = {
      {"F32", DType::kF32}, {"F16", DType::kF16}, {"BF16", DType::kBF16},
      {"I8", DType::kI8},   {"U8", DType::kU8},   {"I32", DType::kI32},
      {"I64", DType::kI64}, {"BOOL", DType::kU8}, {"F8_E4M3", DType::kF8E4M3},
  };
  for (const auto& [n, t] : kTable) {
    if (n == name) {
      *out = t;
      return true;
    }
  }
  return false;
}

struct ParsedHeader {
  std::vector<TensorInfo> tensors;  // sorted by data offset
  std::map<std::string, std::string> metadata;
};

// Validates the whole header of a file whose bytes are [file_data, file_data + file_size)
// and resolves data pointers into it. `path` names the file in errors, `file_label` goes
// into TensorInfo::file.
ParsedHeader parse_file(const uint8_t* file_data, uint64_t file_size, const std::string& path,
                        const std::string& file_label, bool resolve_data) {
  if (file_size < 8) {
    fail("{}: truncated safetensors file: {} bytes, but the file must start with an 8-byte header length", path,
         file_size);
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | file_data[i];  // little-endian
  if (header_len > kMaxHeaderBytes) {
    fail("{}: safetensors header length {} bytes exceeds the {} MB limit (corrupt file, or not a safetensors file)",
         path, header_len, kMaxHeaderBytes >> 20);
  }
  if (8 + header_len > file_size) {
    fail("{}: truncated safetensors file: header length is {} bytes but the file has only {} bytes after the length",
         path, header_len, file_size - 8);
  }
  const uint64_t data_size = file_size - 8 - header_len;
  const uint8_t* data_section = file_data + 8 + header_len;

  // nlohmann keeps the last of two equal keys; a tensor named twice is a corrupt header.
  std::set<std::string> top_level_keys;
  std::string duplicate_key;
  auto note_duplicates = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth == 1 && event == json::parse_event_t::key && parsed.is_string() &&
        !top_level_keys.insert(parsed.get<std::string>()).second && duplicate_key.empty()) {
      duplicate_key = parsed.get<std::string>();
    }
    return true;
  };
  const std::string_view header_text(reinterpret_cast<const char*>(file_data + 8), header_len);
  if (json_nesting_depth(header_text, kMaxJsonFileDepth) > kMaxJsonFileDepth) {
    fail("{}: malformed safetensors header JSON: nested deeper than {} levels", path, kMaxJsonFileDepth);
  }
  json header;
  try {
    header = json::parse(file_data + 8, file_data + 8 + header_len, note_duplicates);
  } catch (const json::exception& e) {
    fail("{}: malformed safetensors header JSON: {}", path, json_error_text(e));
  }
  if (!duplicate_key.empty()) fail("{}: tensor '{}' appears twice in the header", path, duplicate_key);
  if (!header.is_object())
    fail("{}: malformed safetensors header: expected a JSON object, got {}", path, header.type_name());

  struct Range {
    uint64_t begin, end;
  };
  ParsedHeader out;
  std::vector<Range> ranges;
  for (const auto& item : header.items()) {
    // Named references, not a structured binding: the lambda below uses them (clang 14,
    // the fuzz build's compiler, cannot capture structured bindings).
    const std::string& name = item.key();
    const json& entry = item.value();
    if (name == "__metadata__") {
      if (!entry.is_object()) fail("{}: __metadata__ must be a JSON object of strings", path);
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) fail("{}: __metadata__ value '{}' must be a string, got {}", path, k, v.type_name());
        out.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    if (!entry.is_object())
      fail("{}: tensor '{}': header entry must be an object, got {}", path, name, entry.type_name());
    auto field = [&](const char* key) -> const json& {
      auto it = entry.find(key);
      if (it == entry.end()) fail("{}: tensor '{}': header entry has no '{}'", path, name, key);
      return *it;
    };
    const json& dtype_json = field("dtype");
    const json& shape_json = field("shape");
    const json& offsets_json = field("data_offsets");

    TensorInfo info;
    info.name = name;
    info.file = file_label;
    if (!dtype_json.is_string()) fail("{}: tensor '{}': dtype must be a string", path, name);
    const std::string dtype_str = dtype_json.get<std::string>();
    if (!parse_dtype(dtype_str, &info.dtype)) {
      fail("{}: tensor '{}' has unsupported dtype '{}' (supported: F32, F16, BF16, I8, U8, I32, I64, BOOL)", path, name,
           dtype_str);
    }

    if (!shape_json.is_array()) fail("{}: tensor '{}': shape must be an array of integers", path, name);
    uint64_t numel = 1;
    uint64_t nonzero = 1;  // the product without zero dimensions: shape arithmetic must not wrap either
    bool overflow = false;
    for (const auto& d : shape_json) {
      if (!d.is_number_unsigned())
        fail("{}: tensor '{}': shape {} must hold non-negative integers", path, name, json_excerpt(shape_json));
      const uint64_t dim = d.get<uint64_t>();
      if (dim > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(numel, dim, &numel)) overflow = true;
      if (dim != 0 && (__builtin_mul_overflow(nonzero, dim, &nonzero) || nonzero > static_cast<uint64_t>(INT64_MAX)))
        overflow = true;
      info.shape.push_back(static_cast<int64_t>(std::min<uint64_t>(dim, INT64_MAX)));
    }
    uint64_t expected_bytes = 0;
    if (overflow || __builtin_mul_overflow(numel, dtype_size(info.dtype), &expected_bytes)) {
      fail("{}: tensor '{}': shape {} is too large", path, name, json_excerpt(shape_json));
    }

    if (!offsets_json.is_array() || offsets_json.size() != 2 || !offsets_json[0].is_number_unsigned() ||
        !offsets_json[1].is_number_unsigned()) {
      fail("{}: tensor '{}': data_offsets must be [begin, end] with non-negative integers, got {}", path, name,
           json_excerpt(offsets_json));
    }
    const uint64_t begin = offsets_json[0].get<uint64_t>();
    const uint64_t end = offsets_json[1].get<uint64_t>();
    if (end < begin) fail("{}: tensor '{}': data_offsets [{}, {}] end before begin", path, name, begin, end);
    if (end > data_size) {
      fail(
          "{}: tensor '{}': data_offsets [{}, {}] point past the end of the file (data section has {} bytes; "
          "truncated download?)",
          path, name, begin, end, data_size);
    }
    if (end - begin != expected_bytes) {
      fail("{}: tensor '{}': data_offsets [{}, {}] hold {} bytes but shape {} of {} needs {} bytes", path, name, begin,
           end, end - begin, json_excerpt(shape_json), dtype_str, expected_bytes);
    }
    info.nbytes = static_cast<size_t>(expected_bytes);
    if (resolve_data) info.data = data_section + begin;
    out.tensors.push_back(std::move(info));
    ranges.push_back({begin, end});
  }

  // Sort by offset and check neighbours: two tensors sharing bytes would silently alias.
  std::vector<size_t> order(out.tensors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return ranges[a].begin != ranges[b].begin ? ranges[a].begin < ranges[b].begin : ranges[a].end < ranges[b].end;
  });
  for (size_t i = 1; i < order.size(); ++i) {
    const Range& prev = ranges[order[i - 1]];
    const Range& cur = ranges[order[i]];
    if (cur.begin < prev.end) {
      fail("{}: tensors '{}' (bytes [{}, {})) and '{}' (bytes [{}, {})) overlap", path, out.tensors[order[i - 1]].name,
           prev.begin, prev.end, out.tensors[order[i]].name, cur.begin, cur.end);
    }
  }
  std::vector<TensorInfo> sorted;
  sorted.reserve(order.size());
  for (size_t i : order) sorted.push_back(std::move(out.tensors[i]));
  out.tensors = std::move(sorted);
  return out;
}

std::string join_path(const std::string& dir, const std::string& file) { return (fs::path(dir) / file).string(); }

// A shard name from an index must stay inside the model directory.
bool is_safe_relative_name(const std::string& name) {
  if (name.empty()) return false;
  fs::path p(name);
  if (p.is_absolute()) return false;
  for (const auto& part : p) {
    if (part == "..") return false;
  }
  return true;
}

std::vector<std::string> list_safetensors_files(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().extension() == ".safetensors") out.push_back(entry.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string join_names(const std::vector<std::string>& names, size_t max_count) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < max_count; ++i) {
    if (i) s += ", ";
    s += names[i];
  }
  if (names.size() > max_count) s += fmt::format(", ... ({} more)", names.size() - max_count);
  return s;
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

void check_shape(const TensorInfo& tensor, std::initializer_list<int64_t> expected_shape, const std::string& file) {
  if (std::equal(tensor.shape.begin(), tensor.shape.end(), expected_shape.begin(), expected_shape.end())) return;
  fail("{}: tensor '{}' has shape {}, config.json implies {}", file.empty() ? tensor.file : file, tensor.name,
       shape_string(tensor.shape), shape_string(std::vector<int64_t>(expected_shape)));
}

std::string_view safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kI8: return "I8";
    case DType::kU8: return "U8";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
    case DType::kF8E4M3: return "F8_E4M3";
    case DType::kGgml:
    case DType::kSentinel: break;
  }
  return "?";
}

// ---------------------------------------------------------------------------------------
// WeightStore

struct WeightStore::Impl {
  std::string dir;
  std::vector<MappedFile> files;  // owns the bytes every TensorInfo::data points into
  std::shared_ptr<const void> owner;  // from_tensors: what owns them instead
  std::map<std::string, TensorInfo, std::less<>> tensors;
  std::map<std::string, std::string> metadata;
  size_t total_bytes = 0;
  size_t mapped_bytes = 0;
  LoadProgress* progress = nullptr;  // open(): reports the files read into memory

  // Maps one file and adds its tensors; returns their names.
  std::vector<std::string> add_file(const std::string& file_name, bool load_into_memory) {
    const std::string path = join_path(dir, file_name);
    MappedFile mapped(path, load_into_memory, progress);
    ParsedHeader header = parse_file(mapped.data(), mapped.size(), path, file_name, /*resolve_data=*/true);
    std::vector<std::string> names;
    for (auto& t : header.tensors) {
      auto [it, inserted] = tensors.try_emplace(t.name, t);
      if (!inserted) {
        fail("{}: tensor '{}' is stored in both '{}' and '{}' (duplicate across shards)", dir, t.name, it->second.file,
             file_name);
      }
      total_bytes += t.nbytes;
      names.push_back(t.name);
    }
    for (auto& [k, v] : header.metadata) metadata.emplace(k, v);
    mapped_bytes += mapped.size();
    files.push_back(std::move(mapped));  // moving keeps the mapping (and data pointers) in place
    return names;
  }

  // Maps (or reads) the files; reading them into memory is the "reading" step of `progress`.
  void add_files(const std::set<std::string>& file_names, bool load_into_memory) {
    const bool report = progress != nullptr && load_into_memory;
    if (report) {
      int64_t bytes = 0;
      for (const auto& f : file_names) {
        std::error_code ec;
        const auto size = fs::file_size(join_path(dir, f), ec);
        if (!ec) bytes += static_cast<int64_t>(size);
      }
      progress->begin("reading", bytes);
    }
    for (const auto& f : file_names) add_file(f, load_into_memory);
    if (report) progress->end();
  }

  void open_sharded(bool load_into_memory, const char* index_file = kIndexFile) {
    const std::string index_path = join_path(dir, index_file);
    const json index = read_json_file(index_path);
    if (!index.is_object()) fail("{}: expected a JSON object with a \"weight_map\"", index_path);
    auto wm = index.find("weight_map");
    if (wm == index.end()) fail("{}: no \"weight_map\" (it maps each tensor name to its shard file)", index_path);
    if (!wm->is_object() || wm->empty())
      fail("{}: \"weight_map\" must be a non-empty object of tensor name -> shard file", index_path);

    std::map<std::string, std::string> weight_map;  // tensor -> shard
    std::set<std::string> shards;
    for (const auto& [tensor, shard] : wm->items()) {
      if (!shard.is_string()) fail("{}: weight_map entry '{}' must be a file name string", index_path, tensor);
      std::string shard_name = shard.get<std::string>();
      if (!is_safe_relative_name(shard_name)) {
        fail("{}: weight_map entry '{}' names '{}', which is not a file inside the model directory", index_path, tensor,
             shard_name);
      }
      weight_map[tensor] = shard_name;
      shards.insert(shard_name);
    }
    // Report every missing shard at once: a partial download usually misses several.
    std::vector<std::string> missing;
    for (const auto& s : shards) {
      if (!fs::is_regular_file(join_path(dir, s))) missing.push_back(s);
    }
    if (!missing.empty()) {
      fail("{}: {} of {} shard files named in weight_map are missing: {} (incomplete download?)", index_path,
           missing.size(), shards.size(), join_names(missing, 5));
    }
    add_files(shards, load_into_memory);
    for (const auto& [tensor, shard] : weight_map) {
      auto it = tensors.find(tensor);
      if (it == tensors.end()) {
        fail("{}: tensor '{}' is mapped to '{}' but that file does not contain it", index_path, tensor, shard);
      }
      if (it->second.file != shard) {
        fail("{}: tensor '{}' is mapped to '{}' but is stored in '{}'", index_path, tensor, shard, it->second.file);
      }
    }
  }
};

WeightStore::WeightStore() : impl_(std::make_unique<Impl>()) {}
WeightStore::~WeightStore() = default;
WeightStore::WeightStore(WeightStore&&) noexcept = default;
WeightStore& WeightStore::operator=(WeightStore&&) noexcept = default;

WeightStore WeightStore::open(const std::string& model_dir, bool load_into_memory, LoadProgress* progress) {
  std::error_code ec;
  if (!fs::exists(model_dir, ec)) fail("{}: model directory not found", model_dir);
  if (!fs::is_directory(model_dir, ec)) {
    fail("{}: not a directory (expected a model directory holding config.json and *.safetensors)", model_dir);
  }
  WeightStore store;
  Impl& s = *store.impl_;
  s.dir = model_dir;
  s.progress = progress;
  if (fs::exists(join_path(model_dir, kIndexFile), ec)) {
    s.open_sharded(load_into_memory);
  } else if (fs::exists(join_path(model_dir, kSingleFile), ec)) {
    s.add_files({kSingleFile}, load_into_memory);
  } else if (fs::exists(join_path(model_dir, kSlimIndexFile), ec)) {
    s.open_sharded(load_into_memory, kSlimIndexFile);
  } else if (fs::exists(join_path(model_dir, kSlimSingleFile), ec)) {
    s.add_files({kSlimSingleFile}, load_into_memory);
  } else {
    std::vector<std::string> others = list_safetensors_files(model_dir);
    if (others.empty()) {
      fail("{}: no weights: neither {} nor {} exists (is this a Hugging Face model directory?)", model_dir, kSingleFile,
           kIndexFile);
    }
    fail("{}: neither {} nor {} exists; found {}, but without an index Infera cannot tell which files are the model",
         model_dir, kSingleFile, kIndexFile, join_names(others, 5));
  }
  s.progress = nullptr;
  return store;
}

WeightStore WeightStore::from_tensors(std::string source, std::vector<TensorInfo> tensors,
                                      std::shared_ptr<const void> owner, size_t mapped_bytes) {
  WeightStore store;
  Impl& s = *store.impl_;
  s.dir = std::move(source);
  s.owner = std::move(owner);
  s.mapped_bytes = mapped_bytes;
  for (TensorInfo& t : tensors) {
    s.total_bytes += t.nbytes;
    if (!s.tensors.try_emplace(t.name, t).second) fail("{}: duplicate tensor '{}'", s.dir, t.name);
  }
  return store;
}

const TensorInfo* WeightStore::find(std::string_view name) const {
  auto it = impl_->tensors.find(name);
  return it == impl_->tensors.end() ? nullptr : &it->second;
}

const TensorInfo& WeightStore::get(std::string_view name) const {
  if (const TensorInfo* t = find(name)) return *t;
  // Suggest the names sharing the most leading plus trailing characters: that finds the
  // same tensor of another layer (a layer missing) or under another prefix
  // (model.language_model.* vs model.*).
  std::vector<std::pair<size_t, std::string_view>> scored;
  for (const auto& [n, info] : impl_->tensors) {
    const size_t limit = std::min(n.size(), name.size());
    size_t prefix = 0;
    while (prefix < limit && n[prefix] == name[prefix]) ++prefix;
    size_t suffix = 0;
    while (prefix + suffix < limit && n[n.size() - 1 - suffix] == name[name.size() - 1 - suffix]) ++suffix;
    scored.emplace_back(prefix + suffix, n);
  }
  std::stable_sort(scored.begin(), scored.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::string hint;
  for (size_t i = 0; i < scored.size() && i < 3 && scored[i].first > 0; ++i) {
    hint += fmt::format("{}'{}'", hint.empty() ? "; closest: " : ", ", scored[i].second);
  }
  fail("{}: tensor '{}' not found ({} tensors in {} file(s){})", impl_->dir, name, impl_->tensors.size(),
       impl_->files.size(), hint);
}

const TensorInfo& WeightStore::get(std::string_view name, std::initializer_list<int64_t> expected_shape) const {
  const TensorInfo& t = get(name);
  check_shape(t, expected_shape, join_path(impl_->dir, t.file));
  return t;
}

std::vector<std::string> WeightStore::names() const {
  std::vector<std::string> out;
  out.reserve(impl_->tensors.size());
  for (const auto& [n, info] : impl_->tensors) out.push_back(n);
  return out;
}

size_t WeightStore::size() const { return impl_->tensors.size(); }
size_t WeightStore::total_bytes() const { return impl_->total_bytes; }
size_t WeightStore::mapped_bytes() const { return impl_->mapped_bytes; }
const std::string& WeightStore::dir() const { return impl_->dir; }
const std::map<std::string, std::string>& WeightStore::metadata() const { return impl_->metadata; }

// ---------------------------------------------------------------------------------------
// Writer and header-only reader

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::set<std::string_view> seen;
  for (const auto& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__") fail("{}: invalid tensor name '{}'", path, t.name);
    if (!seen.insert(t.name).second) fail("{}: tensor '{}' given twice", path, t.name);
    if (t.dtype >= DType::kSentinel) fail("{}: tensor '{}' has an invalid dtype", path, t.name);
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0) fail("{}: tensor '{}' has a negative dimension in shape {}", path, t.name, shape_string(t.shape));
      numel *= static_cast<uint64_t>(d);
    }
    if (numel * dtype_size(t.dtype) != t.nbytes) {
      fail("{}: tensor '{}': {} bytes given but shape {} of {} needs {}", path, t.name, t.nbytes, shape_string(t.shape),
           safetensors_dtype_name(t.dtype), numel * dtype_size(t.dtype));
    }
    if (t.nbytes > 0 && t.data == nullptr) fail("{}: tensor '{}' has no data", path, t.name);
  }

  // Larger elements first, then by name: each tensor starts at a multiple of its element
  // size (the data section itself starts at a multiple of 8).
  std::vector<const TensorToWrite*> order;
  for (const auto& t : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const TensorToWrite* a, const TensorToWrite* b) {
    const size_t sa = dtype_size(a->dtype), sb = dtype_size(b->dtype);
    return sa != sb ? sa > sb : a->name < b->name;
  });

  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const TensorToWrite* t : order) {
    header[t->name] = {{"dtype", safetensors_dtype_name(t->dtype)},
                       {"shape", t->shape},
                       {"data_offsets", {offset, offset + t->nbytes}}};
    offset += t->nbytes;
  }
  std::string header_text = header.dump();
  header_text.append((8 - (8 + header_text.size()) % 8) % 8, ' ');

  const std::string tmp_path = path + ".tmp";
  std::FILE* f = std::fopen(tmp_path.c_str(), "wb");
  if (!f) fail("{}: cannot create: {}", tmp_path, std::strerror(errno));
  uint8_t len_bytes[8];
  const uint64_t header_len = header_text.size();
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<uint8_t>(header_len >> (8 * i));
  bool ok = std::fwrite(len_bytes, 1, 8, f) == 8 &&
            std::fwrite(header_text.data(), 1, header_text.size(), f) == header_text.size();
  for (const TensorToWrite* t : order) {
    if (!ok) break;
    if (t->nbytes > 0) ok = std::fwrite(t->data, 1, t->nbytes, f) == t->nbytes;
  }
  const int write_errno = errno;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    std::remove(tmp_path.c_str());
    fail("{}: write failed: {}", tmp_path, std::strerror(write_errno));
  }
  std::error_code ec;
  fs::rename(tmp_path, path, ec);
  if (ec) {
    std::remove(tmp_path.c_str());
    fail("{}: cannot rename {} into place: {}", path, tmp_path, ec.message());
  }
}

std::vector<TensorInfo> read_safetensors_header(const std::string& path) {
  // The mapping is lazy, so only the header's pages are actually read.
  MappedFile mapped(path);
  return parse_file(mapped.data(), mapped.size(), path, path, /*resolve_data=*/false).tensors;
}

}  // namespace infera
