#include "infera/model/tensor_dump.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include <fmt/format.h>

#include "infera/base/error.h"

namespace infera {

namespace {

constexpr const char* kNames[] = {"embed",   "attn_norm", "attn_out",   "ffn_norm",
                                  "ffn_out", "layer_out", "final_norm", "logits"};

}  // namespace

const char* TensorDump::known_names() {
  return "embed, attn_norm, attn_out, ffn_norm, ffn_out, layer_out, final_norm, logits (or all)";
}

TensorDump::TensorDump(const std::string& names, const std::string& dir) : dir_(dir) {
  size_t start = 0;
  while (start <= names.size()) {
    size_t end = names.find(',', start);
    if (end == std::string::npos) end = names.size();
    std::string n = names.substr(start, end - start);
    while (!n.empty() && n.front() == ' ') n.erase(n.begin());
    while (!n.empty() && n.back() == ' ') n.pop_back();
    if (n == "all") {
      all_ = true;
    } else if (!n.empty()) {
      bool known = false;
      for (const char* k : kNames) known = known || n == k;
      if (!known) fail("--dump-tensors: unknown tensor name '{}' (known: {})", n, known_names());
      names_.insert(n);
    }
    start = end + 1;
  }
  if (!all_ && names_.empty()) fail("--dump-tensors: no tensor names given (known: {})", known_names());
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  const std::string index = (std::filesystem::path(dir_) / "index.tsv").string();
  index_ = std::fopen(index.c_str(), "w");
  if (!index_) fail("--dump-dir: cannot write '{}'", index);
  std::fprintf(index_, "file\tname\tlayer\tforward\trows\tcols\n");
}

TensorDump::~TensorDump() {
  if (index_) std::fclose(index_);
}

void TensorDump::write(const char* name, int layer, const float* data, int64_t rows, int64_t cols) {
  if (!wants(name)) return;
  const int64_t forward = forward_ < 0 ? 0 : forward_;
  const std::string file = layer >= 0 ? fmt::format("{:04d}-{}-{:03d}.npy", forward, name, layer)
                                      : fmt::format("{:04d}-{}.npy", forward, name);
  const std::string path = (std::filesystem::path(dir_) / file).string();
  // .npy version 1.0: magic, header length, a Python dict literal padded to 64 bytes.
  std::string header = fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {}), }}", rows, cols);
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream out(path, std::ios::binary);
  const uint16_t header_len = static_cast<uint16_t>(header.size());
  out.write("\x93NUMPY\x01\x00", 8);
  out.write(reinterpret_cast<const char*>(&header_len), 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(rows * cols * sizeof(float)));
  if (!out) fail("--dump-dir: cannot write '{}'", path);
  std::fprintf(index_, "%s\t%s\t%d\t%lld\t%lld\t%lld\n", file.c_str(), name, layer, static_cast<long long>(forward),
               static_cast<long long>(rows), static_cast<long long>(cols));
  std::fflush(index_);
  ++files_;
}

std::vector<float> read_npy_f32(const std::string& path, int64_t* rows, int64_t* cols) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot read", path);
  char magic[8];
  uint16_t len = 0;
  in.read(magic, 8);
  in.read(reinterpret_cast<char*>(&len), 2);
  if (!in || std::memcmp(magic, "\x93NUMPY\x01\x00", 8) != 0) fail("{}: not a version 1.0 .npy file", path);
  std::string header(len, '\0');
  in.read(header.data(), len);
  if (header.find("'<f4'") == std::string::npos || header.find("'fortran_order': False") == std::string::npos) {
    fail("{}: not a C-order float32 array", path);
  }
  const size_t open = header.find("'shape': (");
  if (open == std::string::npos) fail("{}: no shape in the header", path);
  long long r = 0, c = 1;
  const int got = std::sscanf(header.c_str() + open + 10, "%lld, %lld", &r, &c);
  if (got < 1 || r < 0 || c < 0) fail("{}: bad shape in the header", path);
  if (got == 1) c = 1;
  std::vector<float> v(static_cast<size_t>(r * c));
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  if (!in) fail("{}: shorter than its shape", path);
  if (rows) *rows = r;
  if (cols) *cols = c;
  return v;
}

}  // namespace infera
