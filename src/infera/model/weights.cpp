#include "infera/model/weights.h"

#include <cstring>

#include "infera/base/error.h"

namespace infera {

kernels::MatRef as_matrix(const TensorInfo& t) {
  if (t.shape.size() != 2) fail("{}: tensor '{}' should be 2-D", t.file, t.name);
  if (t.dtype != DType::kF32 && t.dtype != DType::kBF16 && t.dtype != DType::kF16) {
    fail("{}: tensor '{}' has dtype {}; matrices must be f32, bf16 or f16", t.file, t.name, dtype_name(t.dtype));
  }
  return kernels::MatRef{t.data, t.dtype, t.shape[0], t.shape[1]};
}

int64_t matrix_bytes(const kernels::MatRef& m) { return m.rows * m.cols * static_cast<int64_t>(dtype_size(m.dtype)); }

void to_f32(const void* src, DType dtype, int64_t n, float* out) {
  switch (dtype) {
    case DType::kF32: std::memcpy(out, src, n * sizeof(float)); return;
    case DType::kBF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::kF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(s[i]);
      return;
    }
    default: fail("cannot convert {} to f32", dtype_name(dtype));
  }
}

std::vector<float> load_vector(const WeightStore& store, const std::string& name, int64_t n) {
  const TensorInfo& t = store.get(name, {n});
  std::vector<float> v(n);
  to_f32(t.data, t.dtype, n, v.data());
  return v;
}

void embedding_row(const TensorInfo& table, int64_t row, float* out) {
  const int64_t h = table.shape[1];
  const uint8_t* p = table.data + row * h * static_cast<int64_t>(dtype_size(table.dtype));
  to_f32(p, table.dtype, h, out);
}

int stored_mtp_layers(const std::function<bool(const std::string& name)>& has_tensor) {
  if (!has_tensor("mtp.fc.weight") && !has_tensor("mtp.fc.weight.qweight")) return 0;
  int n = 0;
  while (has_tensor("mtp.layers." + std::to_string(n) + ".input_layernorm.weight")) ++n;
  return n;
}

int stored_mtp_layers(const WeightStore& store) {
  return stored_mtp_layers([&store](const std::string& name) { return store.find(name) != nullptr; });
}

}  // namespace infera
