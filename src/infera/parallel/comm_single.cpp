// The base class's timing wrapper and the single-rank communicator.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "infera/base/error.h"
#include "infera/base/options.h"
#include "infera/parallel/communicator.h"

namespace infera::parallel {

std::string_view collective_name(Collective c) {
  switch (c) {
    case Collective::kAllReduce: return "all_reduce";
    case Collective::kAllGather: return "all_gather";
    case Collective::kGather: return "gather";
    case Collective::kBroadcast: return "broadcast";
    case Collective::kAllToAll: return "all_to_all";
    case Collective::kBarrier: return "barrier";
    case Collective::kCount: break;
  }
  return "?";
}

int64_t CommStats::calls() const {
  int64_t n = 0;
  for (const auto& s : by_kind) n += s.calls;
  return n;
}
int64_t CommStats::bytes() const {
  int64_t n = 0;
  for (const auto& s : by_kind) n += s.bytes;
  return n;
}
double CommStats::seconds() const {
  double n = 0;
  for (const auto& s : by_kind) n += s.seconds;
  return n;
}

namespace {

// Adds one call of `kind` with `bytes` and its wall time to the stats.
class Timed {
 public:
  Timed(CommStats& stats, Collective kind, int64_t bytes)
      : s_(stats.by_kind[static_cast<size_t>(kind)]), start_(std::chrono::steady_clock::now()) {
    s_.calls += 1;
    s_.bytes += bytes;
  }
  ~Timed() { s_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }

 private:
  CollectiveStats& s_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace

// Only these wrappers touch the stats; implementations override the do_* hooks.
#define INFERA_TIMED(kind, bytes) Timed timed_(stats_, kind, bytes)

void Communicator::all_reduce_sum(float* data, int64_t n) {
  INFERA_ASSERT(n >= 0);
  INFERA_TIMED(Collective::kAllReduce, n * static_cast<int64_t>(sizeof(float)));
  do_all_reduce_sum(data, n);
}

void Communicator::all_gather(const void* send, int64_t bytes, void* recv) {
  INFERA_ASSERT(bytes >= 0);
  INFERA_TIMED(Collective::kAllGather, bytes);
  do_all_gather(send, bytes, recv);
}

void Communicator::gather(const void* send, int64_t bytes, void* recv, int root) {
  INFERA_ASSERT(bytes >= 0 && root >= 0 && root < size());
  INFERA_TIMED(Collective::kGather, bytes);
  do_gather(send, bytes, recv, root);
}

void Communicator::broadcast(void* data, int64_t bytes, int root) {
  INFERA_ASSERT(bytes >= 0 && root >= 0 && root < size());
  INFERA_TIMED(Collective::kBroadcast, bytes);
  do_broadcast(data, bytes, root);
}

void Communicator::all_to_all(const void* send, const int64_t* send_bytes, void* recv, const int64_t* recv_bytes) {
  int64_t sent = 0;
  for (int r = 0; r < size(); ++r) sent += r == rank() ? 0 : send_bytes[r];
  INFERA_TIMED(Collective::kAllToAll, sent);
  do_all_to_all(send, send_bytes, recv, recv_bytes);
}

void Communicator::barrier() {
  INFERA_TIMED(Collective::kBarrier, 0);
  do_barrier();
}

#undef INFERA_TIMED

namespace {

class SingleCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string_view backend() const override { return "single"; }
  [[noreturn]] void abort(int code) override {
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(code);
  }

 protected:
  void do_all_reduce_sum(float*, int64_t) override {}
  void do_all_gather(const void* send, int64_t bytes, void* recv) override { copy(send, bytes, recv); }
  void do_gather(const void* send, int64_t bytes, void* recv, int) override { copy(send, bytes, recv); }
  void do_broadcast(void*, int64_t, int) override {}
  void do_all_to_all(const void* send, const int64_t* send_bytes, void* recv, const int64_t* recv_bytes) override {
    INFERA_ASSERT(send_bytes[0] == recv_bytes[0], "all_to_all: a rank's send and receive sizes to itself differ");
    copy(send, send_bytes[0], recv);
  }
  void do_barrier() override {}

 private:
  static void copy(const void* src, int64_t bytes, void* dst) {
    if (bytes > 0 && src != dst) std::memmove(dst, src, static_cast<size_t>(bytes));
  }
};

// The launcher's variables are declared (and documented) in base/options.cpp.
int env_int(const char* name, int fallback) {
  const std::string v = launcher_env(name);
  if (v.empty()) return fallback;
  return std::atoi(v.c_str());
}

}  // namespace

std::unique_ptr<Communicator> make_single_communicator() { return std::make_unique<SingleCommunicator>(); }

bool launched_by_mpi() {
  return launcher_env_set("OMPI_COMM_WORLD_SIZE") || launcher_env_set("PMIX_RANK") || launcher_env_set("PMI_RANK");
}

int launcher_world_size() {
  int n = env_int("OMPI_COMM_WORLD_SIZE", 0);
  if (n <= 0) n = env_int("PMI_SIZE", 0);
  return n > 0 ? n : 1;
}

int launcher_local_size() {
  const int n = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1);
  return n > 0 ? n : 1;
}

int launcher_rank() {
  int r = env_int("OMPI_COMM_WORLD_RANK", -1);
  if (r < 0) r = env_int("PMIX_RANK", -1);
  if (r < 0) r = env_int("PMI_RANK", -1);
  return r >= 0 ? r : 0;
}

}  // namespace infera::parallel
