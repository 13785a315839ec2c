#include "infera/tools/imatrix.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <string_view>

#include "infera/base/error.h"
#include "infera/io/gguf.h"
#include "infera/io/safetensors.h"
#include "infera/model/config.h"
#include "infera/model/model.h"
#include "infera/model/tensor_table.h"
#include "infera/quant/calibration.h"

namespace infera {

namespace {

// Adds the statistics of one matrix (matrix index `mat` of `matrices`) to entry `name`.
void add_matrix_stats(Imatrix& out, const std::string& name, int64_t matrices, int64_t mat,
                      const quant::ChannelStats& s) {
  const auto cols = static_cast<int64_t>(s.sum_sq.size());
  ImatrixEntry& e = out.entries[name];
  if (e.counts.empty()) {
    e.cols = cols;
    e.sums.assign(static_cast<size_t>(matrices * cols), 0.0f);
    e.counts.assign(static_cast<size_t>(matrices), 0.0f);
  }
  if (e.cols != cols || static_cast<int64_t>(e.counts.size()) != matrices) {
    fail("imatrix: '{}' was recorded with {} columns, expected {}", name, cols, e.cols);
  }
  for (int64_t j = 0; j < cols; ++j) e.sums[static_cast<size_t>(mat * cols + j)] = static_cast<float>(s.sum_sq[j]);
  e.counts[static_cast<size_t>(mat)] = static_cast<float>(s.count);
}

}  // namespace

Imatrix compute_imatrix(const std::string& model_dir, const ImatrixOptions& o) {
  if (o.chunk_size < 2) fail("--chunk-size {}: a calibration window needs at least 2 tokens", o.chunk_size);
  const std::vector<int32_t> ids = quant::calibration_tokens(model_dir, o.calib_file, o.calib_tokens);
  const ModelConfig config = load_model_config(model_dir);
  std::vector<TensorSpec> table;
  {
    const WeightStore store = WeightStore::open(model_dir);
    table = tensor_table(config, [&store](const std::string& n) { return store.find(n) != nullptr; });
  }
  LoadOptions lo;
  lo.max_batch_tokens = 128;
  std::unique_ptr<Model> model = load_model(model_dir, lo);
  quant::ExpertActivationStats experts;
  const quant::ActivationStats stats = quant::collect_activation_stats(*model, ids, o.chunk_size, &experts);
  model.reset();

  Imatrix out;
  out.datasets = {o.calib_file};
  out.chunk_size = static_cast<uint32_t>(o.chunk_size);
  out.chunk_count = static_cast<uint32_t>((static_cast<int64_t>(ids.size()) + o.chunk_size - 1) / o.chunk_size);
  out.tokens = static_cast<int64_t>(ids.size());
  for (const TensorSpec& t : table) {
    // llama-imatrix's default: the blocks' matrices, as stored (columns = the input).
    if (!t.gguf.starts_with("blk.") || t.gguf_form != GgufForm::kAsIs || t.shape.size() < 2) continue;
    if (t.shape.size() == 3 || t.expert >= 0) {
      const int64_t E = config.num_experts;
      auto it = experts.find(t.name);
      if (it == experts.end()) continue;  // no token reached it (an entry of count 0 comes from its siblings)
      std::vector<std::string> names = {t.gguf};
      if (t.slot == "ffn_gate_up_exps") {
        // A fused gate_up tensor: the table names the gate half; the up half shares its input.
        std::string up = t.gguf;
        up.replace(up.rfind("ffn_gate_exps"), 13, "ffn_up_exps");
        names.push_back(up);
      }
      const std::vector<quant::ChannelStats>& per = it->second;
      for (size_t e = 0; e < per.size(); ++e) {
        if (per[e].count == 0) continue;
        const int64_t mat = t.expert >= 0 ? t.expert : static_cast<int64_t>(e);
        if (t.expert >= 0 && static_cast<int64_t>(e) != t.expert) {
          fail("imatrix: expert matrix '{}' was observed as expert {}, the table says {}", t.name, e, t.expert);
        }
        for (const std::string& n : names) add_matrix_stats(out, n, E, mat, per[e]);
      }
      continue;
    }
    auto it = stats.find(t.name);
    if (it == stats.end() || it->second.count == 0) continue;
    add_matrix_stats(out, t.gguf, 1, 0, it->second);
  }
  if (out.entries.empty()) fail("{}: the calibration recorded no block matrix with a GGUF name", model_dir);
  return out;
}

void write_imatrix_gguf(const Imatrix& m, const std::string& path) {
  gguf::Writer w;
  w.set("general.type", gguf::Value::string("imatrix"));
  w.set("imatrix.datasets", gguf::Value::string_array(m.datasets));
  w.set("imatrix.chunk_count", gguf::Value::u32(m.chunk_count));
  w.set("imatrix.chunk_size", gguf::Value::u32(m.chunk_size));
  for (const auto& [name, e] : m.entries) {
    const auto matrices = static_cast<uint64_t>(e.counts.size());
    INFERA_ASSERT(e.sums.size() == matrices * static_cast<uint64_t>(e.cols), "imatrix entry of the wrong size");
    w.add_tensor(name + ".in_sum2", gguf::GgmlType::kF32, {static_cast<uint64_t>(e.cols), matrices}, e.sums.data());
    w.add_tensor(name + ".counts", gguf::GgmlType::kF32, {1, matrices}, e.counts.data());
  }
  w.write(path);
}

Imatrix read_imatrix_gguf(const std::string& path) {
  const gguf::Reader r(path);
  Imatrix out;
  if (const gguf::Value* v = r.find("imatrix.datasets"); v && v->is_array()) out.datasets = v->str_array();
  if (const gguf::Value* v = r.find("imatrix.chunk_count")) out.chunk_count = static_cast<uint32_t>(v->to_u64());
  if (const gguf::Value* v = r.find("imatrix.chunk_size")) out.chunk_size = static_cast<uint32_t>(v->to_u64());
  constexpr std::string_view kSums = ".in_sum2";
  for (const gguf::Tensor& t : r.tensors()) {
    if (!std::string_view(t.name).ends_with(kSums)) continue;
    const std::string name = t.name.substr(0, t.name.size() - kSums.size());
    const gguf::Tensor* counts = r.find_tensor(name + ".counts");
    if (!counts) fail("{}: '{}' has no matching '{}.counts'", path, t.name, name);
    if (t.type != gguf::GgmlType::kF32 || counts->type != gguf::GgmlType::kF32) {
      fail("{}: '{}' and its counts must be F32", path, t.name);
    }
    const uint64_t n_counts = counts->n_elements(), n_sums = t.n_elements();
    if (n_counts == 0 || n_sums % n_counts != 0) {
      fail("{}: '{}' has {} sums for {} counts", path, t.name, n_sums, n_counts);
    }
    ImatrixEntry& e = out.entries[name];
    e.cols = static_cast<int64_t>(n_sums / n_counts);
    e.sums.resize(n_sums);
    e.counts.resize(n_counts);
    std::memcpy(e.sums.data(), t.data, n_sums * 4);
    std::memcpy(e.counts.data(), counts->data, n_counts * 4);
  }
  if (out.entries.empty()) fail("{}: no '<tensor>.in_sum2' tensors: not an importance matrix", path);
  return out;
}

std::unordered_map<std::string, std::vector<float>> imatrix_importance(const Imatrix& m) {
  std::unordered_map<std::string, std::vector<float>> out;
  for (const auto& [name, e] : m.entries) {
    std::vector<float>& v = out[name];
    v.resize(e.sums.size());
    const auto cols = static_cast<size_t>(e.cols);
    for (size_t j = 0; j < e.counts.size(); ++j) {
      const auto count = static_cast<float>(std::lround(e.counts[j]));
      for (size_t i = 0; i < cols; ++i) v[j * cols + i] = count > 0.0f ? e.sums[j * cols + i] / count : 1.0f;
    }
  }
  return out;
}

std::unordered_map<std::string, std::vector<float>> load_imatrix_importance(const std::string& path) {
  std::unordered_map<std::string, std::vector<float>> out;
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("{}: cannot open the importance matrix", path);
  char magic[4] = {};
  f.read(magic, 4);
  if (std::string_view(magic, 4) == "GGUF") {
    f.close();
    out = imatrix_importance(read_imatrix_gguf(path));
  } else {
    f.clear();
    f.seekg(0);
    auto i32 = [&](const char* what) {
      int32_t v = 0;
      f.read(reinterpret_cast<char*>(&v), 4);
      if (!f) fail("{}: truncated importance matrix (reading {})", path, what);
      return v;
    };
    const int32_t entries = i32("the entry count");
    if (entries < 1) fail("{}: neither an imatrix GGUF nor a legacy imatrix .dat file", path);
    for (int32_t e = 0; e < entries; ++e) {
      const int32_t len = i32("a name length");
      if (len < 1 || len > 4096) fail("{}: entry {} has a name of {} bytes: not an imatrix file", path, e, len);
      std::string name(static_cast<size_t>(len), '\0');
      f.read(name.data(), len);
      const int32_t ncall = i32("ncall"), nval = i32("nval");
      if (nval < 1) fail("{}: entry '{}' has {} values", path, name, nval);
      std::vector<float>& v = out[name];
      v.resize(static_cast<size_t>(nval));
      f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(nval) * 4);
      if (!f) fail("{}: truncated importance matrix (values of '{}')", path, name);
      if (ncall > 0) {
        for (float& x : v) x = x / static_cast<float>(ncall);
      }
    }
  }
  for (const auto& [name, v] : out) {
    for (float x : v) {
      if (!std::isfinite(x)) fail("{}: importance matrix of '{}' has a non-finite value", path, name);
    }
  }
  return out;
}

}  // namespace infera
