// Small helpers shared by the unit tests of several modules.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <utility>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <system_error>
#include <vector>

namespace infera::test {

// Resident memory of this process (the resident pages of /proc/self/statm), bytes.
inline int64_t resident_bytes() {
  std::ifstream in("/proc/self/statm");
  int64_t size = 0, resident = 0;
  in >> size >> resident;
  return resident * ::sysconf(_SC_PAGESIZE);
}

// n samples of N(0, scale²), reproducible from `seed`.
inline std::vector<float> random_vec(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Removes a folder when the test binary ends (register with AddGlobalTestEnvironment).
class RemoveDirAtExit : public ::testing::Environment {
 public:
  explicit RemoveDirAtExit(std::filesystem::path dir) : dir_(std::move(dir)) {}
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

 private:
  std::filesystem::path dir_;
};

// Runs a shell command, returns {exit status, stdout}.
inline std::pair<int, std::string> shell(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return {-1, ""};
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// <temp>/<prefix>_<pid>: a scratch folder of this test process, removed at exit.
inline std::filesystem::path process_scratch_dir(const std::string& prefix) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / (prefix + "_" + std::to_string(::getpid()));
  ::testing::AddGlobalTestEnvironment(new RemoveDirAtExit(dir));
  return dir;
}

}  // namespace infera::test
