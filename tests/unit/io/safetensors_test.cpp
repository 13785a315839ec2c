#include "infera/io/safetensors.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../test_support.h"
#include "infera/base/error.h"

namespace infera {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const std::string kStoriesDir = test::stories_dir();

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("infera_io_" + std::to_string(::getpid()) + "_" + info->test_suite_name() + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(v >> (8 * i));
  return s;
}

// A safetensors file with the given header text and `data_bytes` zero bytes of data.
std::string raw_file(const std::string& header, size_t data_bytes) {
  return le64(header.size()) + header + std::string(data_bytes, '\0');
}

// Expects `fn` to throw infera::Error whose message contains every needle.
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& needles) {
  try {
    fn();
    ADD_FAILURE() << "expected an error containing '" << needles.front() << "'";
  } catch (const Error& e) {
    for (const auto& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << "message: " << e.what() << "\nmissing: " << n;
  }
}

// --- bad single files: each through WeightStore::open and read_safetensors_header ------

struct BadFileCase {
  const char* label;
  std::string bytes;
  std::vector<std::string> needles;
};

TEST_F(SafetensorsTest, BadFilesGiveOneClearError) {
  const std::string ok_entry = R"("w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]})";
  const std::vector<BadFileCase> cases = {
      {"empty file", "", {"truncated", "8-byte header length"}},
      {"shorter than 8 bytes", std::string("\x05\x00\x00", 3), {"truncated", "3 bytes"}},
      {"header length past end", le64(1000) + "{}", {"truncated", "header length is 1000"}},
      {"absurd header length", le64(200ull << 20) + "{}", {"exceeds the 100 MB limit"}},
      {"malformed json", raw_file(R"({"w": {"dtype": "F32",)", 0), {"malformed safetensors header JSON", "line 1"}},
      {"header not an object", raw_file("[1, 2]", 0), {"expected a JSON object"}},
      {"offsets past end",
       raw_file(R"({"w": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]}})", 16),
       {"tensor 'w'", "past the end of the file", "data section has 16 bytes"}},
      {"end before begin",
       raw_file(R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [16, 0]}})", 16),
       {"tensor 'w'", "end before begin"}},
      {"overlapping tensors",
       raw_file("{" + ok_entry + R"(, "v": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})", 24),
       {"'w'", "'v'", "overlap"}},
      {"nbytes not matching shape",
       raw_file(R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}})", 16),
       {"tensor 'w'", "hold 12 bytes", "needs 16 bytes"}},
      {"unknown dtype",
       raw_file(R"({"w": {"dtype": "F8_E5M2", "shape": [4], "data_offsets": [0, 4]}})", 4),
       {"tensor 'w'", "unsupported dtype 'F8_E5M2'"}},
      {"missing data_offsets",
       raw_file(R"({"w": {"dtype": "F32", "shape": [4]}})", 16),
       {"tensor 'w'", "no 'data_offsets'"}},
      {"negative dimension",
       raw_file(R"({"w": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}})", 16),
       {"tensor 'w'", "non-negative"}},
      {"overflowing shape",
       raw_file(R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 16]}})", 16),
       {"tensor 'w'", "too large"}},
      // Zero elements, so zero bytes, but the other dimensions' product wraps int64.
      {"overflowing shape with a zero dimension",
       raw_file(R"({"w": {"dtype": "F32", "shape": [0, 4294967296, 4294967296], "data_offsets": [0, 0]}})", 16),
       {"tensor 'w'", "too large"}},
      {"header nested without end",
       raw_file(std::string(100000, '[') + std::string(100000, ']'), 0),
       {"nested deeper"}},
      {"bad offsets type",
       raw_file(R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0]}})", 16),
       {"tensor 'w'", "data_offsets must be [begin, end]"}},
      {"tensor named twice",
       raw_file("{" + ok_entry + R"(, "w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 16),
       {"tensor 'w' appears twice"}},
      {"metadata not strings",
       raw_file("{\"__metadata__\": {\"format\": 1}, " + ok_entry + "}", 16),
       {"__metadata__", "'format'"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.label);
    const std::string file = path("model.safetensors");
    write_bytes(file, c.bytes);
    std::vector<std::string> needles = c.needles;
    needles.push_back(file);  // every message names the file
    expect_error([&] { WeightStore::open(dir_.string()); }, needles);
    expect_error([&] { read_safetensors_header(file); }, needles);
  }
}

TEST_F(SafetensorsTest, ValidRawFileIsAccepted) {
  // Guards the table above: the same layout with correct values must load.
  write_bytes(
      path("model.safetensors"),
      raw_file(R"({"__metadata__": {"format": "pt"}, "w": {"dtype": "BOOL", "shape": [2, 2], "data_offsets": [0, 4]},
                          "e": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]}})",
               4));
  WeightStore store = WeightStore::open(dir_.string());
  EXPECT_EQ(store.get("w").dtype, DType::kU8);
  EXPECT_EQ(store.get("w", {2, 2}).nbytes, 4u);
  EXPECT_EQ(store.get("e").numel(), 0);
  EXPECT_EQ(store.metadata().at("format"), "pt");
}

TEST_F(SafetensorsTest, CorruptedFilesNeverCrash) {
  // Every truncation and 150 seeded byte flips of a valid file: each must
  // either load or throw infera::Error (run under ASan/UBSan this also checks bounds).
  std::vector<float> a(6, 1.0f);
  std::vector<uint16_t> b(5, 7);
  const std::string file = path("model.safetensors");
  write_safetensors(file, {{"a", DType::kF32, {2, 3}, a.data(), 24}, {"b", DType::kBF16, {5}, b.data(), 10}},
                    {{"format", "pt"}});
  const std::string good = read_file(file);
  auto try_open = [&](const std::string& bytes) {
    write_bytes(file, bytes);
    try {
      WeightStore store = WeightStore::open(dir_.string());
      for (const auto& n : store.names()) {
        const TensorInfo& t = store.get(n);
        ASSERT_EQ(static_cast<size_t>(t.numel()) * dtype_size(t.dtype), t.nbytes);
      }
    } catch (const Error&) {
    }
  };
  size_t rejected = 0;
  for (size_t len = 0; len < good.size(); ++len) {
    write_bytes(file, good.substr(0, len));
    try {
      WeightStore::open(dir_.string());
    } catch (const Error&) {
      ++rejected;
    }
  }
  EXPECT_EQ(rejected, good.size());  // any truncation loses data bytes or header bytes
  uint32_t rng = 12345;
  for (int i = 0; i < 150; ++i) {
    std::string bytes = good;
    rng = rng * 1664525u + 1013904223u;
    bytes[(rng >> 8) % bytes.size()] = static_cast<char>(rng >> 24);
    try_open(bytes);
  }
}

// --- directory-level errors ---------------------------------------------------------------

TEST_F(SafetensorsTest, DirectoryErrors) {
  expect_error([&] { WeightStore::open(path("does_not_exist")); }, {"does_not_exist", "model directory not found"});
  expect_error([&] { WeightStore::open(dir_.string()); }, {dir_.string(), "no weights", "model.safetensors"});

  write_bytes(path("consolidated.safetensors"), raw_file("{}", 0));
  expect_error([&] { WeightStore::open(dir_.string()); }, {"consolidated.safetensors", "without an index"});

  write_bytes(path("file"), "x");
  expect_error([&] { WeightStore::open(path("file")); }, {"not a directory"});
}

struct ShardedFixture {
  std::vector<float> a = std::vector<float>(6);
  std::vector<uint16_t> b = std::vector<uint16_t>(4);
  std::vector<int32_t> c = std::vector<int32_t>(3);
  ShardedFixture() {
    std::iota(a.begin(), a.end(), 1.0f);
    for (size_t i = 0; i < b.size(); ++i) b[i] = f32_to_bf16(0.5f * static_cast<float>(i));
    std::iota(c.begin(), c.end(), -1);
  }
  // Shard 1: a, b; shard 2: c.
  void write(const std::string& dir, const json& weight_map) const {
    write_safetensors(dir + "/model-00001-of-00002.safetensors",
                      {{"model.a", DType::kF32, {2, 3}, a.data(), a.size() * 4},
                       {"model.b", DType::kBF16, {4}, b.data(), b.size() * 2}},
                      {{"format", "pt"}, {"shard", "1"}});
    write_safetensors(dir + "/model-00002-of-00002.safetensors",
                      {{"model.c", DType::kI32, {3}, c.data(), c.size() * 4}}, {{"format", "pt"}, {"shard", "2"}});
    std::ofstream(dir + "/model.safetensors.index.json")
        << json{{"metadata", {{"total_size", 40}}}, {"weight_map", weight_map}}.dump(1);
  }
  static json good_map() {
    return {{"model.a", "model-00001-of-00002.safetensors"},
            {"model.b", "model-00001-of-00002.safetensors"},
            {"model.c", "model-00002-of-00002.safetensors"}};
  }
};

TEST_F(SafetensorsTest, ShardedRoundTrip) {
  ShardedFixture fx;
  fx.write(dir_.string(), ShardedFixture::good_map());
  for (bool in_memory : {false, true}) {
    SCOPED_TRACE(in_memory ? "load_into_memory" : "mmap");
    WeightStore store = WeightStore::open(dir_.string(), in_memory);
    EXPECT_EQ(store.names(), (std::vector<std::string>{"model.a", "model.b", "model.c"}));
    EXPECT_EQ(store.size(), 3u);
    EXPECT_EQ(store.dir(), dir_.string());
    EXPECT_EQ(store.total_bytes(), 24u + 8u + 12u);
    EXPECT_EQ(store.mapped_bytes(), fs::file_size(dir_ / "model-00001-of-00002.safetensors") +
                                        fs::file_size(dir_ / "model-00002-of-00002.safetensors"));
    const TensorInfo& a = store.get("model.a", {2, 3});
    EXPECT_EQ(a.dtype, DType::kF32);
    EXPECT_EQ(a.file, "model-00001-of-00002.safetensors");
    EXPECT_EQ(std::memcmp(a.data, fx.a.data(), a.nbytes), 0);
    const TensorInfo& b = store.get("model.b", {4});
    EXPECT_EQ(b.dtype, DType::kBF16);
    EXPECT_EQ(std::memcmp(b.data, fx.b.data(), b.nbytes), 0);
    const TensorInfo& c = store.get("model.c", {3});
    EXPECT_EQ(c.dtype, DType::kI32);
    EXPECT_EQ(c.file, "model-00002-of-00002.safetensors");
    EXPECT_EQ(std::memcmp(c.data, fx.c.data(), c.nbytes), 0);
    EXPECT_EQ(store.metadata().at("format"), "pt");
    EXPECT_EQ(store.metadata().at("shard"), "1");  // first file in name order wins
    EXPECT_EQ(store.find("model.d"), nullptr);
  }
}

TEST_F(SafetensorsTest, ShardedErrors) {
  ShardedFixture fx;
  const std::string index = path("model.safetensors.index.json");

  json missing_shard = ShardedFixture::good_map();
  missing_shard["model.d"] = "model-00003-of-00003.safetensors";
  fx.write(dir_.string(), missing_shard);
  expect_error([&] { WeightStore::open(dir_.string()); },
               {index, "1 of 3 shard files", "missing", "model-00003-of-00003.safetensors"});

  json absent_tensor = ShardedFixture::good_map();
  absent_tensor["model.z"] = "model-00002-of-00002.safetensors";
  fx.write(dir_.string(), absent_tensor);
  expect_error([&] { WeightStore::open(dir_.string()); },
               {index, "tensor 'model.z'", "model-00002-of-00002.safetensors", "does not contain it"});

  json wrong_shard = ShardedFixture::good_map();
  wrong_shard["model.b"] = "model-00002-of-00002.safetensors";
  fx.write(dir_.string(), wrong_shard);
  expect_error([&] { WeightStore::open(dir_.string()); },
               {index,
                "tensor 'model.b' is mapped to 'model-00002-of-00002.safetensors' but is stored in "
                "'model-00001-of-00002.safetensors'"});

  json escaping = ShardedFixture::good_map();
  escaping["model.c"] = "../elsewhere.safetensors";
  fx.write(dir_.string(), escaping);
  expect_error([&] { WeightStore::open(dir_.string()); }, {index, "not a file inside the model directory"});

  fx.write(dir_.string(), ShardedFixture::good_map());
  std::vector<float> dup(6, 0.0f);
  write_safetensors(path("model-00002-of-00002.safetensors"),
                    {{"model.a", DType::kF32, {2, 3}, dup.data(), 24}, {"model.c", DType::kI32, {3}, fx.c.data(), 12}});
  expect_error([&] { WeightStore::open(dir_.string()); },
               {dir_.string(), "tensor 'model.a'", "duplicate across shards", "model-00002-of-00002.safetensors"});

  fx.write(dir_.string(), ShardedFixture::good_map());
  write_bytes(index, R"({"weight_map": {"model.a": )");
  expect_error([&] { WeightStore::open(dir_.string()); }, {index, "malformed JSON", "line 1"});
  write_bytes(index, R"({"metadata": {}})");
  expect_error([&] { WeightStore::open(dir_.string()); }, {index, "no \"weight_map\""});
  write_bytes(index, R"({"weight_map": {"model.a": 3}})");
  expect_error([&] { WeightStore::open(dir_.string()); }, {index, "'model.a'", "file name string"});

  // A corrupt shard is reported with the shard's own path.
  fx.write(dir_.string(), ShardedFixture::good_map());
  write_bytes(path("model-00002-of-00002.safetensors"), "abc");
  expect_error([&] { WeightStore::open(dir_.string()); }, {path("model-00002-of-00002.safetensors"), "truncated"});
}

// --- writer ------------------------------------------------------------------------------

TEST_F(SafetensorsTest, WriterLayoutAlignmentAndPadding) {
  std::vector<uint8_t> u8(3, 7);
  std::vector<uint16_t> f16(5, f32_to_f16(1.5f));
  std::vector<int64_t> i64 = {-5, 1LL << 40};
  std::vector<int8_t> i8 = {-1, 2, -3};
  std::vector<float> f32 = {1, 2, 3};
  const std::string file = path("model.safetensors");
  write_safetensors(file,
                    {{"u8", DType::kU8, {3}, u8.data(), 3},
                     {"f16", DType::kF16, {5}, f16.data(), 10},
                     {"i64", DType::kI64, {2}, i64.data(), 16},
                     {"i8", DType::kI8, {1, 3}, i8.data(), 3},
                     {"f32", DType::kF32, {3, 1}, f32.data(), 12}},
                    {{"format", "pt"}});
  const std::string bytes = read_file(file);
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  EXPECT_EQ((8 + header_len) % 8, 0u);
  const std::string header = bytes.substr(8, header_len);
  EXPECT_EQ(header.front(), '{');
  EXPECT_EQ(header.find_last_not_of(' '), header.rfind('}'));  // padding is spaces only
  EXPECT_FALSE(fs::exists(file + ".tmp"));

  WeightStore store = WeightStore::open(dir_.string());
  for (const auto& name : store.names()) {
    const TensorInfo& t = store.get(name);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % dtype_size(t.dtype), 0u) << name << " is misaligned";
  }
  EXPECT_EQ(std::memcmp(store.get("i64", {2}).data, i64.data(), 16), 0);
  EXPECT_EQ(std::memcmp(store.get("f16", {5}).data, f16.data(), 10), 0);
  EXPECT_EQ(std::memcmp(store.get("i8", {1, 3}).data, i8.data(), 3), 0);
  EXPECT_EQ(std::memcmp(store.get("f32", {3, 1}).data, f32.data(), 12), 0);
  EXPECT_EQ(std::memcmp(store.get("u8", {3}).data, u8.data(), 3), 0);

  // The header-only reader sees the same tensors, in data order, without data pointers.
  std::vector<TensorInfo> header_only = read_safetensors_header(file);
  ASSERT_EQ(header_only.size(), 5u);
  EXPECT_EQ(header_only.front().name, "i64");  // largest element size first
  for (const auto& t : header_only) {
    EXPECT_EQ(t.data, nullptr);
    EXPECT_EQ(t.nbytes, store.get(t.name).nbytes);
    EXPECT_EQ(t.shape, store.get(t.name).shape);
  }
}

TEST_F(SafetensorsTest, WriterRejectsBadInput) {
  std::vector<float> v(4);
  const std::string file = path("x.safetensors");
  expect_error(
      [&] {
        write_safetensors(file, {{"w", DType::kF32, {4}, v.data(), 12}});
      },
      {file, "tensor 'w'", "needs 16"});
  expect_error(
      [&] {
        write_safetensors(file, {{"w", DType::kF32, {4}, v.data(), 16}, {"w", DType::kF32, {4}, v.data(), 16}});
      },
      {file, "'w' given twice"});
  expect_error([&] { write_safetensors(path("no_such_dir/x.safetensors"), {}); }, {"cannot create"});
  EXPECT_FALSE(fs::exists(file));
}

// --- shape checks and lookups ---------------------------------------------------------------

TEST_F(SafetensorsTest, ShapeMismatchAndMissingTensorMessages) {
  std::vector<float> v(6);
  write_safetensors(path("model.safetensors"), {{"model.layers.0.q.weight", DType::kF32, {2, 3}, v.data(), 24},
                                                {"model.layers.0.k.weight", DType::kF32, {3, 2}, v.data(), 24}});
  WeightStore store = WeightStore::open(dir_.string());
  expect_error(
      [&] {
        store.get("model.layers.0.q.weight", {3, 2});
      },
      {path("model.safetensors"), "tensor 'model.layers.0.q.weight' has shape [2, 3], config.json implies [3, 2]"});
  expect_error([&] { store.get("model.layers.0.q.weight", {6}); }, {"has shape [2, 3], config.json implies [6]"});
  EXPECT_NO_THROW(check_shape(store.get("model.layers.0.q.weight"), {2, 3}));
  expect_error([&] { check_shape(store.get("model.layers.0.q.weight"), {2}); },
               {"model.safetensors: tensor 'model.layers.0.q.weight' has shape [2, 3], config.json implies [2]"});
  expect_error([&] { store.get("model.layers.0.v.weight"); },
               {dir_.string(), "tensor 'model.layers.0.v.weight' not found", "closest", "model.layers.0.k.weight"});
  // The same tensor of another layer ranks first.
  expect_error([&] { store.get("model.layers.1.k.weight"); },
               {"not found (2 tensors in 1 file(s); closest: 'model.layers.0.k.weight'"});
}

// --- the real fixture ---------------------------------------------------------------------

TEST(SafetensorsFixture, Stories260KLoadsWithExpectedShapes) {
  INFERA_REQUIRE_FIXTURE(kStoriesDir);
  for (bool in_memory : {false, true}) {
    SCOPED_TRACE(in_memory ? "load_into_memory" : "mmap");
    WeightStore store = WeightStore::open(kStoriesDir, in_memory);
    EXPECT_EQ(store.size(), 1u + 5u * 9u + 1u);  // embedding, 9 per block, final norm (tied head)
    EXPECT_EQ(store.find("lm_head.weight"), nullptr);
    EXPECT_EQ(store.metadata().at("format"), "pt");
    const std::string file = kStoriesDir + "/model.safetensors";
    EXPECT_EQ(store.mapped_bytes(), fs::file_size(file));

    size_t bytes =
        store.get("model.embed_tokens.weight", {512, 64}).nbytes + store.get("model.norm.weight", {64}).nbytes;
    for (int l = 0; l < 5; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      bytes += store.get(p + "input_layernorm.weight", {64}).nbytes;
      bytes += store.get(p + "self_attn.q_proj.weight", {64, 64}).nbytes;
      bytes += store.get(p + "self_attn.k_proj.weight", {32, 64}).nbytes;
      bytes += store.get(p + "self_attn.v_proj.weight", {32, 64}).nbytes;
      bytes += store.get(p + "self_attn.o_proj.weight", {64, 64}).nbytes;
      bytes += store.get(p + "post_attention_layernorm.weight", {64}).nbytes;
      bytes += store.get(p + "mlp.gate_proj.weight", {172, 64}).nbytes;
      bytes += store.get(p + "mlp.up_proj.weight", {172, 64}).nbytes;
      bytes += store.get(p + "mlp.down_proj.weight", {64, 172}).nbytes;
    }
    EXPECT_EQ(bytes, store.total_bytes());
    for (const auto& name : store.names()) {
      EXPECT_EQ(store.get(name).dtype, DType::kF32) << name;
      EXPECT_EQ(static_cast<size_t>(store.get(name).numel()) * 4, store.get(name).nbytes) << name;
    }

    // Data pointers address the right bytes: compare with an independent read of the file.
    const std::string raw = read_file(file);
    uint64_t header_len = 0;
    std::memcpy(&header_len, raw.data(), 8);
    const json header = json::parse(raw.substr(8, header_len));
    for (const char* name : {"model.embed_tokens.weight", "model.layers.4.mlp.down_proj.weight", "model.norm.weight"}) {
      const uint64_t begin = header[name]["data_offsets"][0].get<uint64_t>();
      const TensorInfo& t = store.get(name);
      EXPECT_EQ(std::memcmp(t.data, raw.data() + 8 + header_len + begin, t.nbytes), 0) << name;
    }
  }
}

TEST(SafetensorsFixture, HeaderOnlyReaderMatchesStore) {
  INFERA_REQUIRE_FIXTURE(kStoriesDir);
  const std::string file = kStoriesDir + "/model.safetensors";
  std::vector<TensorInfo> tensors = read_safetensors_header(file);
  WeightStore store = WeightStore::open(kStoriesDir);
  ASSERT_EQ(tensors.size(), store.size());
  for (const auto& t : tensors) {
    EXPECT_EQ(t.file, file);
    EXPECT_EQ(t.shape, store.get(t.name).shape) << t.name;
    EXPECT_EQ(t.nbytes, store.get(t.name).nbytes) << t.name;
  }
}

}  // namespace
}  // namespace infera
