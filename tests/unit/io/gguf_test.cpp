#include "infera/io/gguf.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "../test_support.h"
#include "infera/base/error.h"

namespace infera::gguf {
namespace {

namespace fs = std::filesystem;

const std::string kFixture = test::stories_gguf();

struct TempDir : test::TempDir {
  TempDir() : test::TempDir("infera_gguf_test") {}
};

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

std::string error_of(const std::string& path) {
  try {
    Reader r(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Gguf, RoundTripsEveryValueTypeAndTensors) {
  TempDir dir;
  Writer w;
  w.set("general.architecture", Value::string("llama"));
  w.set("t.u8", Value::u8(200));
  w.set("t.i8", Value::i8(-100));
  w.set("t.u16", Value::u16(60000));
  w.set("t.i16", Value::i16(-30000));
  w.set("t.u32", Value::u32(4000000000u));
  w.set("t.i32", Value::i32(-2000000000));
  w.set("t.f32", Value::f32(1e-5f));
  w.set("t.bool", Value::boolean(true));
  w.set("t.u64", Value::u64(uint64_t{1} << 40));
  w.set("t.i64", Value::i64(-(int64_t{1} << 40)));
  w.set("t.f64", Value::f64(3.141592653589793));
  w.set("t.strs", Value::string_array({"a", "", "▁b c"}));
  w.set("t.i32s", Value::array_of(ValueType::kI32, std::vector<int>{1, -2, 3}));
  w.set("t.f32s", Value::array_of(ValueType::kF32, std::vector<float>{0.5f, -1.25f}));
  w.set("t.empty", Value::array_of(ValueType::kU8, std::vector<int>{}));
  w.set("t.u32", Value::u32(7));  // replaces in place, keeps order

  std::vector<float> a(3 * 5);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i) * 0.5f - 3.0f;
  std::vector<uint16_t> b(7);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint16_t>(0x3c00 + i);
  w.add_tensor("a.weight", GgmlType::kF32, {5, 3}, a.data());
  // Producer that streams in two pieces.
  w.add_tensor("b.weight", GgmlType::kF16, {7}, [&](ByteSink& out) {
    out.write(b.data(), 6);
    out.write(reinterpret_cast<const uint8_t*>(b.data()) + 6, b.size() * 2 - 6);
  });
  std::vector<uint16_t> c(2 * 2 * 2 * 3, 0x3f80);
  w.add_tensor("c", GgmlType::kBF16, {3, 2, 2, 2}, c.data());
  const std::string path = dir.file("rt.gguf");
  size_t progress_calls = 0;
  w.write(path, [&](size_t done, size_t total, uint64_t, uint64_t) {
    ++progress_calls;
    EXPECT_EQ(total, 3u);
    EXPECT_LE(done, total);
  });
  EXPECT_EQ(progress_calls, 3u);
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  Reader r(path);
  EXPECT_EQ(r.version(), 3u);
  EXPECT_EQ(r.alignment(), 32u);
  EXPECT_EQ(r.data_offset() % 32, 0u);
  ASSERT_EQ(r.metadata().size(), w.metadata().size());
  for (size_t i = 0; i < w.metadata().size(); ++i) {
    EXPECT_EQ(r.metadata()[i].first, w.metadata()[i].first);
    EXPECT_EQ(r.metadata()[i].second, w.metadata()[i].second) << r.metadata()[i].first;
  }
  EXPECT_EQ(r.get("t.u8").to_u64(), 200u);
  EXPECT_EQ(r.get("t.i8").to_i64(), -100);
  EXPECT_EQ(r.get("t.u16").to_u64(), 60000u);
  EXPECT_EQ(r.get("t.i16").to_i64(), -30000);
  EXPECT_EQ(r.get("t.u32").to_u64(), 7u);
  EXPECT_EQ(r.metadata()[5].first, "t.u32");
  EXPECT_EQ(r.get("t.i32").to_i64(), -2000000000);
  EXPECT_FLOAT_EQ(static_cast<float>(r.get("t.f32").to_f64()), 1e-5f);
  EXPECT_TRUE(r.get("t.bool").to_bool());
  EXPECT_EQ(r.get("t.u64").to_u64(), uint64_t{1} << 40);
  EXPECT_EQ(r.get("t.i64").to_i64(), -(int64_t{1} << 40));
  EXPECT_DOUBLE_EQ(r.get("t.f64").to_f64(), 3.141592653589793);
  EXPECT_EQ(r.get("t.strs").str_array(), (std::vector<std::string>{"a", "", "▁b c"}));
  EXPECT_EQ(r.get("t.i32s").i64_array(), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(r.get("t.f32s").f64_array(), (std::vector<double>{0.5, -1.25}));
  EXPECT_EQ(r.get("t.empty").array_size(), 0u);
  EXPECT_THROW(r.get("t.i8").to_u64(), Error);  // negative
  EXPECT_THROW(r.get("t.strs").str(), Error);
  EXPECT_THROW(r.get("missing.key"), Error);

  ASSERT_EQ(r.tensors().size(), 3u);
  const Tensor& ta = r.tensor("a.weight");
  EXPECT_EQ(ta.type, GgmlType::kF32);
  EXPECT_EQ(ta.ne, (std::vector<uint64_t>{5, 3}));
  EXPECT_EQ(ta.nbytes, a.size() * 4);
  EXPECT_EQ(std::memcmp(ta.data, a.data(), ta.nbytes), 0);
  const Tensor& tb = r.tensor("b.weight");
  EXPECT_EQ(tb.type, GgmlType::kF16);
  EXPECT_EQ(tb.offset % 32, 0u);
  EXPECT_EQ(std::memcmp(tb.data, b.data(), tb.nbytes), 0);
  const Tensor& tc = r.tensor("c");
  EXPECT_EQ(tc.type, GgmlType::kBF16);
  EXPECT_EQ(tc.n_elements(), 24u);
  EXPECT_EQ(std::memcmp(tc.data, c.data(), tc.nbytes), 0);
  EXPECT_EQ(r.file_size() % 32, 0u);  // last tensor padded
  EXPECT_THROW(r.tensor("nope"), Error);
}

TEST(Gguf, HonorsGeneralAlignment) {
  TempDir dir;
  Writer w;
  w.set("general.alignment", Value::u32(64));
  std::vector<float> x(3, 1.0f), y(5, 2.0f);
  w.add_tensor("x", GgmlType::kF32, {3}, x.data());
  w.add_tensor("y", GgmlType::kF32, {5}, y.data());
  w.write(dir.file("a.gguf"));
  Reader r(dir.file("a.gguf"));
  EXPECT_EQ(r.alignment(), 64u);
  EXPECT_EQ(r.data_offset() % 64, 0u);
  EXPECT_EQ(r.tensor("y").offset, 64u);
  EXPECT_EQ(reinterpret_cast<const float*>(r.tensor("y").data)[4], 2.0f);

  Writer bad;
  bad.set("general.alignment", Value::u32(48));
  EXPECT_THROW(bad.write(dir.file("b.gguf")), Error);
}

TEST(Gguf, WriterRejectsBadTensors) {
  TempDir dir;
  Writer w;
  std::vector<float> x(4);
  w.add_tensor("x", GgmlType::kF32, {4}, x.data());
  EXPECT_THROW(w.add_tensor("x", GgmlType::kF32, {4}, x.data()), Error);  // duplicate
  EXPECT_THROW(w.add_tensor("q", GgmlType::kQ8_0, {16, 2}, x.data()), Error);  // not a block multiple
  EXPECT_THROW(w.add_tensor("z", GgmlType::kF32, {}, x.data()), Error);  // no dims
  EXPECT_THROW(w.add_tensor(std::string(64, 'n'), GgmlType::kF32, {4}, x.data()), Error);
  EXPECT_EQ(tensor_nbytes(GgmlType::kQ8_0, {64, 3}), 2u * 34u * 3u);
  EXPECT_EQ(tensor_nbytes(GgmlType::kQ4_0, {32}), 18u);
  // The first dimension's byte size wraps 2^64 (2^63 F32 elements are 2^65 bytes), and a
  // zero dimension must not hide an element count that wraps.
  EXPECT_THROW(tensor_nbytes(GgmlType::kF32, {uint64_t{1} << 63}), Error);
  EXPECT_THROW(tensor_nbytes(GgmlType::kF32, {uint64_t{1} << 62, 1}), Error);
  EXPECT_THROW(tensor_nbytes(GgmlType::kF32, {0, uint64_t{1} << 40, uint64_t{1} << 40}), Error);
  EXPECT_EQ(tensor_nbytes(GgmlType::kF32, {0, 4}), 0u);

  // A producer that hands over too few bytes fails by name and leaves no file behind.
  Writer shortw;
  shortw.add_tensor("short", GgmlType::kF32, {4}, [&](ByteSink& out) { out.write(x.data(), 8); });
  const std::string path = dir.file("short.gguf");
  try {
    shortw.write(path);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("short"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

TEST(Gguf, ReadsTheStories260KFixture) {
  INFERA_REQUIRE_FIXTURE(kFixture);
  Reader r(kFixture);
  EXPECT_EQ(r.version(), 3u);
  EXPECT_EQ(r.data_offset(), 14496u);  // documented in shared/models/README.md
  EXPECT_EQ(r.metadata().size(), 29u);
  EXPECT_EQ(r.get("general.architecture").str(), "llama");
  EXPECT_EQ(r.get("llama.block_count").to_u64(), 5u);
  EXPECT_EQ(r.get("tokenizer.ggml.tokens").str_array().size(), 512u);
  EXPECT_EQ(r.get("tokenizer.ggml.tokens").str_array()[410], "▁");
  ASSERT_EQ(r.tensors().size(), 1u + 5u * 9u + 1u);
  EXPECT_EQ(r.tensors()[0].name, "token_embd.weight");
  EXPECT_EQ(r.tensor("token_embd.weight").ne, (std::vector<uint64_t>{64, 512}));
  EXPECT_EQ(r.tensor("blk.0.ffn_down.weight").ne, (std::vector<uint64_t>{172, 64}));
}

// Reading the fixture and writing it back must reproduce llama.cpp's file byte for byte
// (same header encoding, alignment and padding).
TEST(Gguf, RewritesTheFixtureByteIdentically) {
  INFERA_REQUIRE_FIXTURE(kFixture);
  TempDir dir;
  Reader r(kFixture);
  Writer w;
  for (const auto& [key, value] : r.metadata()) w.set(key, value);
  for (const Tensor& t : r.tensors()) w.add_tensor(t.name, t.type, t.ne, t.data);
  w.write(dir.file("copy.gguf"));
  EXPECT_TRUE(read_bytes(dir.file("copy.gguf")) == read_bytes(kFixture));
}

TEST(Gguf, ReaderRejectsBadFilesWithClearErrors) {
  INFERA_REQUIRE_FIXTURE(kFixture);
  TempDir dir;
  const std::vector<uint8_t> good = read_bytes(kFixture);
  ASSERT_GT(good.size(), 14496u);

  write_bytes(dir.file("empty.gguf"), {});
  EXPECT_NE(error_of(dir.file("empty.gguf")).find("not a GGUF file"), std::string::npos);

  std::vector<uint8_t> bad = good;
  bad[0] = 'X';
  write_bytes(dir.file("magic.gguf"), bad);
  EXPECT_NE(error_of(dir.file("magic.gguf")).find("not a GGUF file"), std::string::npos);

  bad = good;
  bad[4] = 9;  // version
  write_bytes(dir.file("version.gguf"), bad);
  EXPECT_NE(error_of(dir.file("version.gguf")).find("unsupported GGUF version 9"), std::string::npos);

  bad = good;
  bad[15] = 0x7f;  // absurd tensor count
  write_bytes(dir.file("count.gguf"), bad);
  EXPECT_NE(error_of(dir.file("count.gguf")).find("corrupt GGUF header"), std::string::npos);

  // Cut inside the header, and inside the tensor data.
  write_bytes(dir.file("header.gguf"), std::vector<uint8_t>(good.begin(), good.begin() + 5000));
  EXPECT_NE(error_of(dir.file("header.gguf")).find("truncated GGUF header"), std::string::npos);
  write_bytes(dir.file("data.gguf"), std::vector<uint8_t>(good.begin(), good.end() - 100));
  const std::string data_error = error_of(dir.file("data.gguf"));
  EXPECT_NE(data_error.find("output_norm.weight"), std::string::npos) << data_error;
  EXPECT_NE(data_error.find("runs past the end"), std::string::npos) << data_error;

  EXPECT_NE(error_of(dir.file("does-not-exist.gguf")).find("cannot open"), std::string::npos);

  // Every truncation point must give an infera::Error, never a crash.
  for (size_t cut = 0; cut < 14496; cut += 97) {
    write_bytes(dir.file("cut.gguf"), std::vector<uint8_t>(good.begin(), good.begin() + cut));
    EXPECT_FALSE(error_of(dir.file("cut.gguf")).empty()) << "cut at " << cut;
  }
}

}  // namespace
}  // namespace infera::gguf
