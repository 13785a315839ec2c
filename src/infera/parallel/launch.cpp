#include "infera/parallel/launch.h"

#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "infera/base/error.h"

namespace infera::parallel {

namespace fs = std::filesystem;

namespace {

std::vector<std::string> own_arguments() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  if (!in) fail("cannot read /proc/self/cmdline to restart under mpirun; start the ranks with mpirun yourself");
  std::vector<std::string> args;
  std::string arg;
  while (std::getline(in, arg, '\0')) args.push_back(arg);
  return args;
}

bool on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  if (!path) return false;
  std::stringstream ss(path);
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    if (!dir.empty() && ::access((dir + "/" + name).c_str(), X_OK) == 0) return true;
  }
  return false;
}

int64_t status_field_kib(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const size_t n = std::strlen(field);
  while (std::getline(in, line)) {
    if (line.compare(0, n, field) == 0 && line.size() > n && line[n] == ':') return std::stoll(line.substr(n + 1));
  }
  return -1;
}

}  // namespace

void relaunch_under_mpirun(int ranks) {
  if (!on_path("mpirun")) {
    fail("--tp/--ep {} starts {} ranks with mpirun, which is not on PATH: apt-get install openmpi-bin "
         "(or start the ranks yourself: mpirun -np {} infera run ...)",
         ranks, ranks, ranks);
  }
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (ec) fail("cannot find this executable (/proc/self/exe) to restart it under mpirun");
  std::vector<std::string> args = {"mpirun", "--oversubscribe", "--bind-to", "none"};
  if (::geteuid() == 0) args.push_back("--allow-run-as-root");
  args.insert(args.end(), {"-np", std::to_string(ranks), self.string()});
  const std::vector<std::string> own = own_arguments();
  args.insert(args.end(), own.begin() + std::min<size_t>(1, own.size()), own.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  // A rank waiting in a collective yields its core instead of spinning: on a host whose
  // cores are shared (more ranks than idle cores, other work) spinning ranks starve the
  // one they wait for (measured on a loaded 2-core machine: 5 -> 17 tokens/s at TP 2).
  // An explicit OMPI_MCA_mpi_yield_when_idle wins.
  ::setenv("OMPI_MCA_mpi_yield_when_idle", "1", /*overwrite=*/0);
  std::fflush(stdout);
  std::fflush(stderr);
  ::execvp("mpirun", argv.data());
  fail("cannot start mpirun: {}", std::strerror(errno));
}

uint64_t model_files_fingerprint(const std::string& model_dir) {
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0);
  const fs::path dir(model_dir);
  {
    std::ifstream in(dir / "config.json", std::ios::binary);
    if (!in) {
      XXH64_freeState(st);
      fail("{}: config.json not found", (dir / "config.json").string());
    }
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    XXH64_update(st, text.data(), text.size());
  }
  std::vector<std::pair<std::string, uint64_t>> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const bool weights = name.ends_with(".safetensors") || name == "model.safetensors.index.json";
    if (weights && e.is_regular_file()) files.emplace_back(name, static_cast<uint64_t>(e.file_size()));
  }
  std::sort(files.begin(), files.end());
  for (const auto& [name, size] : files) {
    XXH64_update(st, name.data(), name.size() + 1);  // with the NUL: "ab"+"c" != "a"+"bc"
    XXH64_update(st, &size, sizeof(size));
  }
  const uint64_t h = XXH64_digest(st);
  XXH64_freeState(st);
  return h;
}

void check_same_model_files(Communicator& comm, const std::string& model_dir) {
  // A rank that cannot read the directory must not leave the others waiting in the
  // all-gather: it contributes 0 and reports its own error after the collective.
  uint64_t mine = 0;
  std::string my_error;
  try {
    mine = model_files_fingerprint(model_dir);
  } catch (const Error& e) {
    my_error = e.what();
  }
  std::vector<uint64_t> all(static_cast<size_t>(comm.size()));
  comm.all_gather(&mine, sizeof(mine), all.data());
  if (!my_error.empty()) fail("rank {}: {}", comm.rank(), my_error);
  std::string differing;
  for (int r = 1; r < comm.size(); ++r) {
    if (all[r] != all[0]) differing += (differing.empty() ? "" : ", ") + std::to_string(r);
  }
  if (!differing.empty()) {
    fail("rank(s) {} see different model files at {} than rank 0 (config.json or weight file sizes differ); "
         "give every host an identical copy of the model directory",
         differing, model_dir);
  }
}

int64_t peak_rss_kib() { return status_field_kib("VmHWM"); }
int64_t current_rss_kib() { return status_field_kib("VmRSS"); }

}  // namespace infera::parallel
