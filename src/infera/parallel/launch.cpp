#include "infera/parallel/launch.h"

#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "infera/base/error.h"
#include "infera/base/options.h"
#include "infera/base/text_file.h"

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

int run_under_mpirun(int ranks, GroupSignals signals) {
  if (!on_path("mpirun")) {
    fail(
        "--tp/--ep {} starts {} ranks with mpirun, which is not on PATH: apt-get install openmpi-bin "
        "(or start the ranks yourself: mpirun -np {} infera ...)",
        ranks, ranks, ranks);
  }
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (ec) fail("cannot find this executable (/proc/self/exe) to restart it under mpirun");
  std::vector<std::string> args = {"mpirun", "--oversubscribe", "--bind-to", "none", "--stdin", "none"};
  if (::geteuid() == 0) args.push_back("--allow-run-as-root");
  args.insert(args.end(), {"-np", std::to_string(ranks), self.string()});
  const std::vector<std::string> own = own_arguments();
  args.insert(args.end(), own.begin() + std::min<size_t>(1, own.size()), own.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  // OpenMPI keeps its session files under <orte_tmpdir_base>/ompi.<host>.<uid>; two groups
  // started side by side share that folder, and one's clean-up can remove the other's
  // files while it starts. A folder of our own (inside the user's base when one is set).
  const std::string user_base = launcher_env("OMPI_MCA_orte_tmpdir_base");
  const fs::path base = !user_base.empty() ? fs::path(user_base) : fs::temp_directory_path();
  std::string session = (base / "infera-mpi-XXXXXX").string();
  fs::create_directories(base, ec);
  if (::mkdtemp(session.data()) == nullptr) {
    fail("cannot create a session folder for mpirun under {}: {}; set TMPDIR to a writable folder", base.string(),
         std::strerror(errno));
  }
  ::setenv("OMPI_MCA_orte_tmpdir_base", session.c_str(), /*overwrite=*/1);
  // A rank waiting in a collective yields its core instead of spinning: on a host whose
  // cores are shared (more ranks than idle cores, other work) spinning ranks starve the
  // one they wait for (measured on a loaded 2-core machine: 5 -> 17 tokens/s at TP 2).
  // An explicit OMPI_MCA_mpi_yield_when_idle wins.
  ::setenv("OMPI_MCA_mpi_yield_when_idle", "1", /*overwrite=*/0);

  // Signals are taken synchronously (sigtimedwait) by this thread; the child restores the
  // old mask before exec. SIGCHLD wakes the wait when mpirun ends.
  sigset_t handled, old;
  sigemptyset(&handled);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) sigaddset(&handled, s);
  pthread_sigmask(SIG_BLOCK, &handled, &old);
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t parent = ::getpid();
  const pid_t child = ::fork();
  if (child < 0) {
    const int err = errno;
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    fs::remove_all(session, ec);
    fail("cannot start mpirun: {}", std::strerror(err));
  }
  if (child == 0) {
    // Only async-signal-safe calls until exec. Own process group: a terminal's Ctrl-C
    // reaches the parent only, which decides (drain or stop). Dies with the parent.
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(1);
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    ::execvp("mpirun", argv.data());
    const char msg[] = "error: cannot start mpirun\n";
    [[maybe_unused]] const ssize_t n = ::write(2, msg, sizeof(msg) - 1);
    ::_exit(127);
  }
  int received = 0, status = 0;
  for (;;) {
    const timespec wait{1, 0};
    const int sig = ::sigtimedwait(&handled, nullptr, &wait);
    if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
      ++received;
      const bool drain = signals == GroupSignals::kDrain && received == 1;
      ::kill(child, drain ? SIGUSR1 : SIGTERM);
    }
    const pid_t done = ::waitpid(child, &status, WNOHANG);
    if (done == child) break;
    if (done < 0 && errno != EINTR) {
      status = 1 << 8;  // lost the child (cannot happen unless someone reaped it): report failure
      break;
    }
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  fs::remove_all(session, ec);
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  if (code != 0 && received == 0) {
    std::fprintf(stderr, "error: the group of %d ranks ended with status %d (the messages above name the rank)\n",
                 ranks, code);
  }
  return code;
}

uint64_t model_files_fingerprint(const std::string& model_dir, const std::vector<std::string>& gguf_parts) {
  const fs::path dir(model_dir);
  std::error_code ec;
  const bool gguf = fs::is_regular_file(dir, ec);
  const std::string config =
      gguf ? std::string() : read_text_file((dir / "config.json").string(), "the model's config");
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0);
  std::vector<std::pair<std::string, uint64_t>> files;
  if (gguf) {  // a GGUF file: its name and size (of a split one, every part's)
    for (const fs::path part : gguf_parts.empty() ? std::vector<std::string>{model_dir} : gguf_parts)
      files.emplace_back(part.filename().string(), static_cast<uint64_t>(fs::file_size(part, ec)));
  } else {
    XXH64_update(st, config.data(), config.size());
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      const bool weights = name.ends_with(".safetensors") || name == "model.safetensors.index.json";
      if (weights && e.is_regular_file()) files.emplace_back(name, static_cast<uint64_t>(e.file_size()));
    }
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

void check_same_model_files(Communicator& comm, const std::string& model_dir, const GgufParts& gguf_parts) {
  // A rank that cannot read the directory must not leave the others waiting in the
  // all-gather: it contributes 0 and reports its own error after the collective.
  uint64_t mine = 0;
  std::string my_error;
  try {
    mine =
        model_files_fingerprint(model_dir, gguf_parts && fs::is_regular_file(model_dir) ? gguf_parts(model_dir)
                                                                                        : std::vector<std::string>{});
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
    fail(
        "rank(s) {} see different model files at {} than rank 0 (config.json or weight file sizes differ); "
        "give every host an identical copy of the model directory",
        differing, model_dir);
  }
}

int64_t peak_rss_kib() { return status_field_kib("VmHWM"); }
int64_t current_rss_kib() { return status_field_kib("VmRSS"); }

void abort_group_after_error(Communicator& comm, const char* what) {
  std::fflush(stdout);
  std::fprintf(stderr, "error: rank %d of %d: %s\n", comm.rank(), comm.size(), what);
  comm.abort(1);
}

}  // namespace infera::parallel
