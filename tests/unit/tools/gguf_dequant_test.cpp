// The C++ dequantization reference (kernels/ggml_quants.h) against tools/gguf_dequant.py, a
// numpy reading of the same formats written independently: a GGUF with random blocks of
// every type is dequantized by both, which must agree exactly. Skips when /usr/bin/python3
// has no numpy.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "../test_support.h"
#include "infera/io/gguf.h"
#include "infera/kernels/ggml_quants.h"
#include "infera/tensor/dtype.h"

namespace infera {
namespace {

namespace g = kernels::ggml;

// The f16 fields of each block type (byte offsets), set to finite values.
std::vector<int> half_fields(uint32_t type) {
  switch (type) {
    case g::kQ4_1:
    case g::kQ5_1:
    case g::kQ4_K:
    case g::kQ5_K: return {0, 2};
    case g::kQ6_K: return {208};
    case g::kQ3_K: return {108};
    case g::kQ2_K: return {80, 82};
    default: return {0};
  }
}

// A .npy file of float32 values (the header is skipped).
std::vector<float> read_npy(const std::string& path) {
  const std::string bytes = test::slurp(path);
  if (bytes.size() < 10) return {};
  uint16_t header_len;
  std::memcpy(&header_len, bytes.data() + 8, 2);
  const size_t start = 10 + header_len;
  std::vector<float> out((bytes.size() - start) / 4);
  std::memcpy(out.data(), bytes.data() + start, out.size() * 4);
  return out;
}

TEST(GgufDequant, CppReferenceEqualsTheNumpyReader) {
  if (std::system("/usr/bin/python3 -c 'import numpy' > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "/usr/bin/python3 has no numpy (apt-get install python3-numpy); tools/gguf_dequant.py needs it";
  }
  test::TempDir dir("infera_gguf_dequant");
  std::mt19937 rng(123);
  std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
  const std::vector<uint32_t> types = {g::kQ4_0, g::kQ4_1, g::kQ5_0, g::kQ5_1, g::kQ8_0,   g::kIQ4_NL, g::kQ2_K,
                                       g::kQ3_K, g::kQ4_K, g::kQ5_K, g::kQ6_K, g::kIQ4_XS, g::kF16,    g::kBF16};
  const int64_t rows = 3, cols = 512;
  std::vector<std::vector<uint8_t>> data;
  gguf::Writer w;
  w.set("general.architecture", gguf::Value::string("test"));
  for (uint32_t type : types) {
    std::vector<uint8_t> bytes(static_cast<size_t>(rows * g::row_bytes(type, cols)));
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    if (g::block_size(type) > 1) {
      for (size_t at = 0; at < bytes.size(); at += static_cast<size_t>(g::type_size(type))) {
        for (int off : half_fields(type)) {
          const uint16_t h = f32_to_f16(scale(rng));
          std::memcpy(bytes.data() + at + off, &h, 2);
        }
      }
    } else {  // plain 16-bit floats: finite values
      for (size_t at = 0; at < bytes.size(); at += 2) {
        const float v = scale(rng) * 100;
        const uint16_t h = type == g::kF16 ? f32_to_f16(v) : f32_to_bf16(v);
        std::memcpy(bytes.data() + at, &h, 2);
      }
    }
    data.push_back(std::move(bytes));
    w.add_tensor("t" + std::to_string(type), static_cast<gguf::GgmlType>(type), {static_cast<uint64_t>(cols), rows},
                 data.back().data());
  }
  const std::string file = dir.file("blocks.gguf");
  w.write(file);
  const std::string out = dir.file("npy");
  const auto [rc, text] = test::shell("/usr/bin/python3 " + std::string(INFERA_SOURCE_DIR) + "/tools/gguf_dequant.py " +
                                      file + " " + out + " 2>&1");
  ASSERT_EQ(rc, 0) << text;
  for (size_t i = 0; i < types.size(); ++i) {
    const std::vector<float> numpy = read_npy(out + "/t" + std::to_string(types[i]) + ".npy");
    ASSERT_EQ(numpy.size(), static_cast<size_t>(rows * cols)) << "type " << types[i];
    std::vector<float> ours(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r) {
      g::dequantize_row(types[i], data[i].data() + r * g::row_bytes(types[i], cols), ours.data() + r * cols, cols);
    }
    for (size_t j = 0; j < ours.size(); ++j) {
      ASSERT_EQ(ours[j], numpy[j]) << "type " << types[i] << " element " << j;
    }
  }
}

}  // namespace
}  // namespace infera
